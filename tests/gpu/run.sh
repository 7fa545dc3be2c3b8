#!/usr/bin/env bash
# The checks that need an NVIDIA GPU and its driver (agent/tests/nvml.rs: discovery
# and sampling of the real GPUs through NVML). Run it on a machine with an NVIDIA GPU:
# SKEIN_TEST_GPU=1 says that a driver is expected, and --include-ignored runs the
# checks that the README's test command reports as ignored (it runs on machines
# without a GPU, where it checks only that no driver is found). Exit status: cargo
# test's.
set -euo pipefail
cd "$(dirname "$0")/../.."
export SKEIN_TEST_GPU=1
exec cargo test --locked -p skein-agent --test nvml -- --include-ignored
