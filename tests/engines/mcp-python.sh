#!/usr/bin/env bash
# Installs the pinned official MCP Python SDK (PyPI `mcp`) into a virtual environment,
# once per machine, and prints the path of its python. Skein's tests run
# tests/tools/mcp_server.py with it: a real MCP tool server over stdio or streamable
# HTTP, the Python twin of the testkit's Rust `mcp-tools`. The venv is cached outside the
# clone, keyed by its pins:
# `${SKEIN_TOOL_CACHE:-~/.cache/skein-tools}/mcp-python-HASH`.
# Safe to run from several tests at once (a lock serialises them). About 70 MB on disk
# and 15 s from PyPI.
set -euo pipefail

# Every package pinned, with its files' hashes: tests/engines/requirements/mcp-python.txt.
. "$(dirname "$0")/pinned-venv.sh"
pinned_venv mcp-python 3.11-3.14 "the MCP Python SDK and its requirements" 'from mcp.server.mcpserver import MCPServer; import uvicorn'
echo "$PINNED_PYTHON"
