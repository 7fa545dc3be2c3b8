#!/usr/bin/env bash
# Installs the pinned Ray into a virtual environment, once per machine, and prints the
# path of its `ray` program. tests/real_ray.rs has agents start real Ray nodes with it (a
# head and workers on loopback) for a split vLLM replica. The venv is cached outside the
# clone, keyed by its pins: `${SKEIN_TOOL_CACHE:-~/.cache/skein-tools}/ray-HASH`. Safe
# to run from several tests at once (a lock serialises them). About 290 MB on disk and
# 15 s from PyPI.
set -euo pipefail

# Every package pinned, with its files' hashes: tests/engines/requirements/ray.txt.
. "$(dirname "$0")/pinned-venv.sh"
pinned_venv ray 3.10-3.13 "Ray and its requirements" 'import ray'
ray="$(dirname "$PINNED_PYTHON")/ray"
"$ray" --version >/dev/null || { echo "ray: the installed ray does not run" >&2; exit 1; }
echo "$ray"
