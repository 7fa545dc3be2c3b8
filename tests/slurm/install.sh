#!/usr/bin/env bash
# What the Slurm test needs, installed once: Debian's slurmctld, slurmd and the client
# commands (slurm-client), and munge for their authentication (as root, or through
# sudo). Safe to run again.
set -euo pipefail

missing=""
for command in slurmctld slurmd sbatch squeue scancel munged; do
  command -v "$command" >/dev/null || missing="$missing $command"
done
[ -z "$missing" ] && exit 0

echo "slurm test: installing Debian's slurmctld, slurmd, slurm-client and munge (missing:$missing)" >&2
sudo=""
if [ "$(id -u)" != 0 ]; then
  if ! command -v sudo >/dev/null || ! sudo -n true 2>/dev/null; then
    echo "slurm test: missing$missing; install Debian's slurmctld, slurmd, slurm-client and munge packages (as root: apt-get install slurmctld slurmd slurm-client munge), or run the test as root or with passwordless sudo" >&2
    exit 1
  fi
  sudo="sudo -n"
fi
export DEBIAN_FRONTEND=noninteractive
# Lists older than a day are refreshed: a fresh machine may have none.
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -1)" ]; then
  $sudo apt-get update -qq
fi
# The packages' own services are not wanted: the test starts its daemons itself.
$sudo apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
