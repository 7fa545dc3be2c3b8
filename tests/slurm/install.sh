#!/usr/bin/env bash
# What the Slurm test needs, installed once: Debian's slurmctld, slurmd and the client
# commands (slurm-client), and munge for their authentication (as root, or through
# sudo). Safe to run again. The packages' own services are not used: the test starts
# its daemons itself.
set -euo pipefail
cd "$(dirname "$0")"

missing=""
for command in slurmctld slurmd sbatch squeue scancel munged; do
  command -v "$command" >/dev/null || missing="$missing $command"
done
[ -z "$missing" ] && exit 0
../../.ci/debian-packages.sh "slurm test (missing:$missing)" slurmctld slurmd slurm-client munge
