#!/usr/bin/env bash
# Replaces the vendored d3 and elkjs with the given versions from the npm registry.
# Usage: web/vendor/update.sh 7.9.2 0.12.1
set -euo pipefail
[ $# = 2 ] || { echo "usage: $0 D3_VERSION ELKJS_VERSION" >&2; exit 2; }
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
npm pack --silent "d3@$1" "elkjs@$2" >/dev/null
mkdir d3 elk
tar xzf "d3-$1.tgz" -C d3
tar xzf "elkjs-$2.tgz" -C elk
cp d3/package/dist/d3.min.js elk/package/lib/elk.bundled.js "$here/"
{
  echo "Libraries vendored in web/vendor/ (see web/vendor/README.md for versions and checksums)."
  echo
  echo "================================================================"
  echo "d3 $1 (web/vendor/d3.min.js) — ISC License"
  echo "================================================================"
  cat d3/package/LICENSE
  echo
  echo "================================================================"
  echo "elkjs $2 (web/vendor/elk.bundled.js) — Eclipse Public License 2.0"
  echo "================================================================"
  cat elk/package/LICENSE.md
} > "$here/LICENSES.txt"
cd "$here" && sha256sum d3.min.js elk.bundled.js
