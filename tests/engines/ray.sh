#!/usr/bin/env bash
# Installs the pinned Ray into a virtual environment, once per machine, and prints the
# path of its `ray` program. tests/real_ray.rs has agents start real Ray nodes with it (a
# head and workers on loopback) for a split vLLM replica. The venv is cached outside the
# clone, keyed by version: `${SKEIN_TOOL_CACHE:-~/.cache/skein-tools}/ray-VERSION`. Safe
# to run from several tests at once (a lock serialises them). About 290 MB on disk and
# 15 s from PyPI.
set -euo pipefail

VERSION=2.60.0
# Ray's own requirements, pinned (what `pip install ray==2.60.0` resolved on 2026-11-26).
DEPS=(
  attrs==26.1.0 certifi==2026.10.19.post1 charset-normalizer==3.5.3 click==8.5.1
  filelock==4.3.1 idna==3.20 jsonschema==4.26.0 jsonschema-specifications==2025.9.1
  msgpack==1.2.4 packaging==26.4 protobuf==7.36.2 PyYAML==6.0.4 referencing==0.37.0
  requests==2.34.2 rpds-py==2026.9.1 typing_extensions==4.16.0 urllib3==2.8.0
)

cache="${SKEIN_TOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skein-tools}"
dir="$cache/ray-$VERSION"
ray="$dir/bin/ray"
installed() { [ -x "$ray" ] && [ -f "$dir/.installed" ]; }
if installed; then echo "$ray"; exit 0; fi

mkdir -p "$cache"
exec 9>"$cache/ray-$VERSION.lock"
flock 9
if installed; then echo "$ray"; exit 0; fi

command -v python3 >/dev/null || { echo "ray $VERSION: python3 is needed (3.10 to 3.13)" >&2; exit 1; }
rm -rf "$dir"
"$(dirname "$0")/../../.ci/python-venv.sh" "ray $VERSION" "$dir"
pip=("$(dirname "$0")/../../.ci/bounded.sh" 900 "ray: pip install" "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --timeout 120 --retries 3)
echo "ray $VERSION: installing Ray and its requirements from PyPI" >&2
"${pip[@]}" --no-deps "ray==$VERSION" "${DEPS[@]}"
"$ray" --version >/dev/null || { echo "ray $VERSION: the installed ray does not run" >&2; exit 1; }
touch "$dir/.installed"
echo "$ray"
