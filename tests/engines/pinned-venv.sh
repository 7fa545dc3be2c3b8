# Sourced by the tests/engines scripts that install pinned Python packages into a venv
# cached outside the clone: `pinned_venv NAME PYTHONS WHAT CHECK`.
#
# - NAME: its requirements, `tests/engines/requirements/NAME.txt`: every package of the
#   closure pinned with the hashes of its files (`tests/engines/lock.py` writes them),
#   installed with `--no-deps --require-hashes`, so nothing unpinned or changed comes in,
#   and `pip check` must agree that nothing is missing;
# - PYTHONS: the Python versions it takes, `3.11-3.14`;
# - WHAT: what it installs, for messages;
# - CHECK: Python code that must run once installed (the imports the tests use).
#
# The venv is `${SKEIN_TOOL_CACHE:-~/.cache/skein-tools}/NAME-HASH`, HASH that of the
# requirements file: other pins install a venv of their own. Sets PINNED_PYTHON to its
# python. Safe to run from several tests at once: a lock serialises them, and a
# half-made venv is made again. pip's whole run is bounded (`.ci/bounded.sh`, 15 min).
pinned_venv() {
  local name="$1" pythons="$2" what="$3" check="$4"
  local here requirements cache dir low high
  here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
  requirements="$here/requirements/$name.txt"
  cache="${SKEIN_TOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skein-tools}"
  dir="$cache/$name-$(sha256sum "$requirements" | cut -c1-10)"
  PINNED_PYTHON="$dir/bin/python"
  if [ -x "$PINNED_PYTHON" ] && [ -f "$dir/.installed" ]; then return 0; fi
  mkdir -p "$cache"
  exec 9>"$dir.lock"
  flock 9
  if [ -x "$PINNED_PYTHON" ] && [ -f "$dir/.installed" ]; then return 0; fi

  low="${pythons%-*}" high="${pythons#*-}"
  command -v python3 >/dev/null || { echo "$name: python3 is needed ($low to $high)" >&2; exit 1; }
  python3 -c 'import sys; lo, hi = (tuple(map(int, v.split("."))) for v in sys.argv[1:]); sys.exit(not lo <= sys.version_info[:2] <= hi)' "$low" "$high" \
    || { echo "$name: needs Python $low to $high, found $(python3 --version)" >&2; exit 1; }
  rm -rf "$dir"
  "$here/../../.ci/python-venv.sh" "$name" "$dir"
  echo "$name: installing $what from PyPI" >&2
  "$here/../../.ci/bounded.sh" 900 "$name: pip install" \
    "$PINNED_PYTHON" -m pip install --quiet --disable-pip-version-check --timeout 120 --retries 3 \
    --no-deps --require-hashes --requirement "$requirements"
  # The pins are the whole closure: pip says so, or names what is missing.
  "$PINNED_PYTHON" -m pip check --disable-pip-version-check >&2 \
    || { echo "$name: the pinned requirements ($requirements) are incomplete" >&2; exit 1; }
  "$PINNED_PYTHON" -c "$check" || { echo "$name: the installed packages do not import" >&2; exit 1; }
  touch "$dir/.installed"
}
