#!/usr/bin/env bash
# Installs the pinned vLLM into a virtual environment, once per machine, and prints the
# path of its python. Skein's tests use it to parse the `vllm serve` command lines Skein
# emits with vLLM's own argument parser and engine arguments (tests/vllm_args.rs); no
# GPU is needed. The venv is cached outside the clone, keyed by version:
# `${SKEIN_TOOL_CACHE:-~/.cache/skein-tools}/vllm-VERSION`. Safe to run from several
# tests at once (a lock serialises them).
#
# The cheapest install that still imports vLLM's parser and config code: the vLLM wheel
# without its dependencies (they pull FlashInfer, TileLang, CUTLASS and more, many GB),
# then torch with its CUDA libraries (vLLM's config imports torch, and PyPI's torch
# refuses to import without them) and the few packages those imports need, pinned.
# About 6.6 GB on disk and 2–4 minutes from PyPI.
set -euo pipefail

VERSION=0.33.0
TORCH=2.14.0
# What `vllm.entrypoints.common.cli_args` and `vllm.engine.arg_utils` import, and what
# the `mistral` tool-call parser imports (`ijson`, `mistral_common` and its imports),
# pinned within vLLM 0.33.0's own requirements. numpy stays below 2.4: mistral_common
# requires it on Python 3.12 and older.
DEPS=(
  packaging==26.4 regex==2026.11.19 PyYAML==6.0.4 pydantic==2.14.4 numpy==2.3.5
  cbor2==6.3.0 psutil==7.2.2 pyzmq==27.3.0 urllib3==2.8.0 transformers==5.20.2
  aiohttp==3.14.5 requests==2.34.2 oss-harmony==0.0.11 openai==3.57.0 msgspec==0.22.0
  cloudpickle==3.1.3 pillow==13.0.0 pybase64==1.5.1 cachetools==8.0.2 uvloop==0.23.0
  py-cpuinfo==9.0.0 'fastapi[standard]==0.136.3' prometheus_client==0.26.0
  partial-json-parser==0.2.1.1.post7 xgrammar==0.2.8 llguidance==1.7.6
  ijson==3.6.0 mistral_common==1.13.1 tiktoken==0.14.0 jsonschema==4.26.0
  pydantic-extra-types==2.11.1 pycountry==26.2.16
)

cache="${SKEIN_TOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skein-tools}"
# Keyed by the pins too: changing one installs a venv of its own.
pins=$(printf '%s\n' "$TORCH" "${DEPS[@]}" | sha256sum | cut -c1-10)
dir="$cache/vllm-$VERSION-$pins"
python="$dir/bin/python"
installed() { [ -x "$python" ] && [ -f "$dir/.installed" ]; }
if installed; then echo "$python"; exit 0; fi

mkdir -p "$cache"
exec 9>"$dir.lock"
flock 9
if installed; then echo "$python"; exit 0; fi

command -v python3 >/dev/null || { echo "vllm $VERSION: python3 is needed (3.11 to 3.14)" >&2; exit 1; }
python3 -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] < (3, 15)))' \
  || { echo "vllm $VERSION: needs Python 3.11 to 3.14, found $(python3 --version)" >&2; exit 1; }
rm -rf "$dir"
"$(dirname "$0")/../../.ci/python-venv.sh" "vllm $VERSION" "$dir"
pip=("$(dirname "$0")/../../.ci/bounded.sh" 1800 "vllm: pip install" "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --timeout 120 --retries 3)
echo "vllm $VERSION: installing vLLM, torch $TORCH (with its CUDA libraries) and the parser's imports from PyPI" >&2
"${pip[@]}" --no-deps "vllm==$VERSION"
"${pip[@]}" "torch==$TORCH" "${DEPS[@]}"
# No GPU here: vLLM's CPU platform lets its configs be built (the agents' vLLM runs on CUDA).
VLLM_TARGET_DEVICE=cpu "$python" -c 'from vllm.entrypoints.common.cli_args import make_arg_parser
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.tool_parsers.abstract_tool_parser import ToolParserManager
for name in ("hermes", "llama3_json", "mistral"):
    ToolParserManager.get_tool_parser(name)' \
  || { echo "vllm $VERSION: the installed vLLM does not import, or lacks a tool-call parser Skein names" >&2; exit 1; }
touch "$dir/.installed"
echo "$python"
