#!/usr/bin/env bash
# What the browser tests need, installed once: Debian's Chromium (as root, or through
# sudo) and playwright-core (npm ci, from package-lock.json). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")"

if [ ! -x /usr/bin/chromium ]; then
  ../../.ci/debian-packages.sh "web tests" chromium fonts-dejavu-core
fi

# One install at a time: the browser tests run at once, and `npm ci` empties
# node_modules first, which would pull playwright-core from under another test that
# found it installed.
exec 9>.install.lock
flock 9

# node_modules/.installed-lock: the lock file node_modules was installed from.
if ! cmp -s package-lock.json node_modules/.installed-lock 2>/dev/null; then
  echo "web tests: npm ci (playwright-core)" >&2
  ../../.ci/bounded.sh 900 "web tests: npm ci" npm ci --no-audit --no-fund --loglevel=error >&2
  cp package-lock.json node_modules/.installed-lock
fi
