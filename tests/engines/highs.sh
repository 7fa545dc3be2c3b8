#!/usr/bin/env bash
# Installs HiGHS, an exact mixed-integer solver (highspy from PyPI, which carries the
# solver built), into a virtual environment, once per machine, and prints the path of
# its python. The planner's oracle (orchestrator/tests/plan_oracle.rs) solves its
# placement programs with it through tests/engines/lexmip.py. The venv is cached outside
# the clone, keyed by its pins: `${SKEIN_TOOL_CACHE:-~/.cache/skein-tools}/highs-HASH`.
# About 60 MB on disk and a few seconds from PyPI.
set -euo pipefail

# Every package pinned, with its files' hashes: tests/engines/requirements/highs.txt.
. "$(dirname "$0")/pinned-venv.sh"
pinned_venv highs 3.11-3.14 "HiGHS (highspy) and numpy" 'import highspy; highspy.Highs()'
echo "$PINNED_PYTHON"
