#!/usr/bin/env bash
# Installs the pinned schemathesis (PyPI), an OpenAPI-driven fuzzer, into a virtual
# environment, once per machine, and prints the path of its python. tests/runs.rs runs
# it against the server's own `/v1/openapi.json`. The venv is cached outside the clone,
# keyed by its pins:
# `${SKEIN_TOOL_CACHE:-~/.cache/skein-tools}/schemathesis-HASH`.
# About 60 MB on disk and 10 s from PyPI.
set -euo pipefail

# Every package pinned, with its files' hashes: tests/engines/requirements/schemathesis.txt.
. "$(dirname "$0")/pinned-venv.sh"
pinned_venv schemathesis 3.11-3.14 "schemathesis and its requirements" 'import schemathesis'
echo "$PINNED_PYTHON"
