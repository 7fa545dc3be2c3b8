#!/usr/bin/env bash
# Creates a Python virtual environment: `python-venv.sh WHO DIR` runs `python3 -m venv
# DIR` (WHO names the tests in messages). A Debian python3 splits venv and ensurepip
# into the python3-venv package; when this python3 cannot import them, that package is
# installed first (through debian-packages.sh: as root or through sudo), so every test
# that needs a venv works on a plain Debian machine, whichever tests ran before it.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 WHO DIR" >&2; exit 2; }
who="$1"
dir="$2"
here="$(cd "$(dirname "$0")" && pwd)"

command -v python3 >/dev/null || { echo "$who: python3 is needed (Debian: apt-get install python3 python3-venv)" >&2; exit 1; }
has_venv() { python3 -c 'import ensurepip, venv' 2>/dev/null; }
if ! has_venv; then
  "$here/debian-packages.sh" "$who" python3-venv
  has_venv || {
    echo "$who: $(command -v python3) still cannot import venv and ensurepip after installing Debian's python3-venv" \
      "(is it Debian's python3? install its venv module, or put a python3 with one first on PATH)" >&2
    exit 1
  }
fi
python3 -m venv "$dir" || { echo "$who: python3 -m venv $dir failed" >&2; exit 1; }
