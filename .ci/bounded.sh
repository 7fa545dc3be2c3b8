#!/usr/bin/env bash
# Runs a command with a bound on its whole duration: `bounded.sh SECONDS WHAT COMMAND...`.
# An install from a package registry (pip, npm, apt) that stalls would otherwise hold a
# test, and CI, until CI's own limit. Past SECONDS the command gets SIGTERM (SIGKILL 10 s
# later) and this says what ran out of time, how long it had, and what to check; the
# exit status is the command's, or 124 when it ran out of time.
set -uo pipefail
seconds="$1"
what="$2"
shift 2
timeout --kill-after=10 "$seconds" "$@"
status=$?
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
  echo "$what: did not finish within $seconds s (stopped): is the package registry reachable and fast? Run it again, or raise the bound in the script that ran it" >&2
  exit 124
fi
exit "$status"
