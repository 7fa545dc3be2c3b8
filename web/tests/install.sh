#!/usr/bin/env bash
# What the browser tests need, installed once: Debian's Chromium (as root, or through
# sudo) and playwright-core (npm ci, from package-lock.json). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")"

if [ ! -x /usr/bin/chromium ]; then
  echo "web tests: installing Debian's chromium" >&2
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "web tests: /usr/bin/chromium is missing; install Debian's chromium package (as root)" >&2; exit 1; }
    sudo="sudo -n"
  fi
  export DEBIAN_FRONTEND=noninteractive
  # Lists older than a day are refreshed: a fresh machine may have none.
  if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -1)" ]; then
    $sudo apt-get update -qq
  fi
  $sudo apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi

# node_modules/.installed-lock: the lock file node_modules was installed from.
if ! cmp -s package-lock.json node_modules/.installed-lock 2>/dev/null; then
  echo "web tests: npm ci (playwright-core)" >&2
  npm ci --no-audit --no-fund --loglevel=error >&2
  cp package-lock.json node_modules/.installed-lock
fi
