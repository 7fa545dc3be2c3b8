#!/usr/bin/env bash
# Installs the pinned official OpenAI and Anthropic Python clients (PyPI `openai`,
# `anthropic`) into a virtual environment, once per machine, and prints the path of its
# python. Skein's tests run tests/clients/*.py with it against a real skein server:
# the clients' own tool loops through /v1/chat/completions and /v1/messages. The venv
# is cached outside the clone, keyed by the versions:
# `${SKEIN_TOOL_CACHE:-~/.cache/skein-tools}/llm-clients-OPENAI-ANTHROPIC`. Safe to run
# from several tests at once (a lock serialises them). About 40 MB on disk and 10 s
# from PyPI.
set -euo pipefail

OPENAI=3.57.0
ANTHROPIC=2.14.0
# Their requirements, pinned (what `pip install openai anthropic` resolved on
# 2026-11-27 for Python 3.11).
DEPS=(
  annotated-types==0.8.0 anyio==4.16.0 docstring_parser==0.18.0 h11==0.16.0
  httpcore2==2.16.2 httpx2==2.16.2 idna==3.20 jiter==0.19.0 opentelemetry-api==1.45.2
  pydantic==2.14.4 pydantic_core==2.50.5 sniffio==1.3.1 truststore==0.10.5
  typing-inspection==0.4.5 typing_extensions==4.16.0
)

name="llm-clients-$OPENAI-$ANTHROPIC"
cache="${SKEIN_TOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skein-tools}"
dir="$cache/$name"
python="$dir/bin/python"
installed() { [ -x "$python" ] && [ -f "$dir/.installed" ]; }
if installed; then echo "$python"; exit 0; fi

mkdir -p "$cache"
exec 9>"$cache/$name.lock"
flock 9
if installed; then echo "$python"; exit 0; fi

command -v python3 >/dev/null || { echo "$name: python3 is needed (3.11 to 3.14)" >&2; exit 1; }
python3 -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] < (3, 15)))' \
  || { echo "$name: needs Python 3.11 to 3.14, found $(python3 --version)" >&2; exit 1; }
rm -rf "$dir"
"$(dirname "$0")/../../.ci/python-venv.sh" "$name" "$dir"
pip=("$(dirname "$0")/../../.ci/bounded.sh" 900 "llm-clients: pip install" "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --timeout 120 --retries 3)
echo "$name: installing the OpenAI and Anthropic Python clients from PyPI" >&2
"${pip[@]}" --no-deps "openai==$OPENAI" "anthropic==$ANTHROPIC" "${DEPS[@]}"
# The pins are the whole closure: pip says so, or names what is missing.
"$python" -m pip check --disable-pip-version-check >&2 \
  || { echo "$name: the pinned requirements are incomplete" >&2; exit 1; }
"$python" -c 'import openai, anthropic' \
  || { echo "$name: the installed clients do not import" >&2; exit 1; }
touch "$dir/.installed"
echo "$python"
