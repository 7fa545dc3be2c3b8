#!/usr/bin/env bash
# Installs the pinned official OpenAI and Anthropic Python clients (PyPI `openai`,
# `anthropic`) into a virtual environment, once per machine, and prints the path of its
# python. Skein's tests run tests/clients/*.py with it against a real skein server:
# the clients' own tool loops through /v1/chat/completions and /v1/messages. The venv
# is cached outside the clone, keyed by its pins:
# `${SKEIN_TOOL_CACHE:-~/.cache/skein-tools}/llm-clients-HASH`. Safe to run
# from several tests at once (a lock serialises them). About 40 MB on disk and 10 s
# from PyPI.
set -euo pipefail

# Every package pinned, with its files' hashes: tests/engines/requirements/llm-clients.txt.
. "$(dirname "$0")/pinned-venv.sh"
pinned_venv llm-clients 3.11-3.14 "the OpenAI and Anthropic Python clients" 'import openai, anthropic'
echo "$PINNED_PYTHON"
