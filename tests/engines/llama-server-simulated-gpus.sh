#!/usr/bin/env bash
# `llama-server` for a node whose GPUs are simulated (tests only). The real CPU build of
# llama.cpp has no GPU device, so each GPU the agent makes visible (CUDA_VISIBLE_DEVICES)
# becomes a local `ggml-rpc-server`, a real device on the CPU, listed after the RPC
# servers Skein passed: llama.cpp then numbers its devices exactly as on a node with real
# GPUs (the `--rpc` servers first, then the node's own GPUs) and places the layers and
# the output by the same rule. Everything else is passed through unchanged, and two flags
# are added for the tests to read what llama.cpp placed: `-lv 5` logs each layer's device
# (`layer N assigned to device …`), and `--load-mode none` (no mmap) makes the host's model buffer what
# the host holds (with a mapped file llama.cpp logs the span of the file it maps, which
# runs across the layers it offloads).
# Needs SKEIN_TEST_LLAMA_BIN: the folder of tests/engines/llama-cpp.sh's build.
set -euo pipefail
bin="${SKEIN_TEST_LLAMA_BIN:?the folder of llama-server and ggml-rpc-server}"
local_servers=()
pids=()
stop() { kill "${pids[@]}" 2>/dev/null || true; }
trap stop EXIT
trap 'stop; exit 143' TERM INT
IFS=',' read -r -a gpus <<<"${CUDA_VISIBLE_DEVICES:-}"
for gpu in "${gpus[@]}"; do
  [ -n "$gpu" ] || continue
  port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  "$bin/ggml-rpc-server" --host 127.0.0.1 --port "$port" >&2 &
  pids+=("$!")
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
  done
  local_servers+=("127.0.0.1:$port")
done
args=()
joined="$(IFS=','; echo "${local_servers[*]:-}")"
while [ $# -gt 0 ]; do
  if [ "$1" = "--rpc" ] && [ $# -gt 1 ]; then
    args+=("--rpc" "$2${joined:+,$joined}")
    joined=""
    shift 2
  else
    args+=("$1")
    shift
  fi
done
[ -z "$joined" ] || args+=("--rpc" "$joined")
"$bin/llama-server" "${args[@]}" -lv 5 --load-mode none &
pids+=("$!")
wait "${pids[-1]}"
