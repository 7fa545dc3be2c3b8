#!/usr/bin/env bash
# Installs the pinned official MCP Python SDK (PyPI `mcp`) into a virtual environment,
# once per machine, and prints the path of its python. Skein's tests run
# tests/tools/mcp_server.py with it: a real MCP tool server over stdio or streamable
# HTTP, the Python twin of the testkit's Rust `mcp-tools`. The venv is cached outside the
# clone, keyed by version: `${SKEIN_TOOL_CACHE:-~/.cache/skein-tools}/mcp-python-VERSION`.
# Safe to run from several tests at once (a lock serialises them). About 70 MB on disk
# and 15 s from PyPI.
set -euo pipefail

VERSION=2.3.0
# mcp's own requirements, pinned (what `pip install mcp==2.3.0` resolved on 2026-11-27
# for Python 3.11), with uvicorn, which the HTTP transport serves with.
DEPS=(
  mcp-types==2.3.0 annotated-types==0.8.0 anyio==4.16.0 attrs==26.1.0 cffi==2.1.1
  click==8.5.1 cryptography==50.0.2 h11==0.16.0 httpcore2==2.16.2 httpx2==2.16.2
  idna==3.20 jsonschema==4.26.0 jsonschema-specifications==2025.9.1
  opentelemetry-api==1.45.2 pycparser==3.12 pydantic==2.14.4 pydantic_core==2.50.5
  PyJWT==2.15.1 python-multipart==0.0.34 referencing==0.37.0 rpds-py==2026.9.1
  sse-starlette==3.7.0 starlette==1.10.0 truststore==0.10.5 typing-inspection==0.4.5
  typing_extensions==4.16.0 uvicorn==0.54.0
)

cache="${SKEIN_TOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skein-tools}"
dir="$cache/mcp-python-$VERSION"
python="$dir/bin/python"
installed() { [ -x "$python" ] && [ -f "$dir/.installed" ]; }
if installed; then echo "$python"; exit 0; fi

mkdir -p "$cache"
exec 9>"$cache/mcp-python-$VERSION.lock"
flock 9
if installed; then echo "$python"; exit 0; fi

command -v python3 >/dev/null || { echo "mcp-python $VERSION: python3 is needed (3.11 to 3.14)" >&2; exit 1; }
python3 -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] < (3, 15)))' \
  || { echo "mcp-python $VERSION: needs Python 3.11 to 3.14, found $(python3 --version)" >&2; exit 1; }
rm -rf "$dir"
"$(dirname "$0")/../../.ci/python-venv.sh" "mcp-python $VERSION" "$dir"
pip=("$(dirname "$0")/../../.ci/bounded.sh" 900 "mcp-python: pip install" "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --timeout 120 --retries 3)
echo "mcp-python $VERSION: installing the MCP Python SDK and its requirements from PyPI" >&2
"${pip[@]}" --no-deps "mcp==$VERSION" "${DEPS[@]}"
# The pins are the whole closure: pip says so, or names what is missing.
"$python" -m pip check --disable-pip-version-check >&2 \
  || { echo "mcp-python $VERSION: the pinned requirements are incomplete" >&2; exit 1; }
"$python" -c 'from mcp.server.mcpserver import MCPServer; import uvicorn' \
  || { echo "mcp-python $VERSION: the installed SDK does not import" >&2; exit 1; }
touch "$dir/.installed"
echo "$python"
