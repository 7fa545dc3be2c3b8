#!/usr/bin/env bash
# Installs Debian packages that tests need, as root or through sudo: `debian-packages.sh
# WHO PACKAGE...` (WHO names the tests in messages). Package lists older than a day are
# refreshed first: a fresh machine may have none. Tests run in parallel, and apt takes
# one install at a time: concurrent calls wait for each other (at most 15 minutes).
set -euo pipefail
who="$1"
shift
lock="${TMPDIR:-/tmp}/skein-debian-packages.lock"
exec 9>>"$lock"
flock -w 900 9 || { echo "$who: another install of Debian packages held $lock for 15 minutes" >&2; exit 1; }
echo "$who: installing Debian's $*" >&2
sudo=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "$who: install Debian's $* (as root)" >&2; exit 1; }
  sudo="sudo -n"
fi
export DEBIAN_FRONTEND=noninteractive
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -1)" ]; then
  "$(dirname "$0")/bounded.sh" 600 "$who: apt-get update" $sudo apt-get update -qq
fi
"$(dirname "$0")/bounded.sh" 1200 "$who: apt-get install $*" \
  $sudo apt-get install -o DPkg::Lock::Timeout=300 -y -qq --no-install-recommends "$@" >/dev/null
