#!/usr/bin/env bash
# The README's second command: installs what is missing, builds, fetches the default data and
# runs the whole CTest suite.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/install_deps.sh"
bash "$root/scripts/build.sh"
bash "$root/scripts/fetch_data.sh"
# The unit-labelled tests (one process each, or a one-rank run) as many at a time as there are
# cores (HPCT_UNIT_JOBS); the rest (MPI ranks, the local Slurm, the modules) one at a time
# (HPCT_TEST_JOBS), since their ranks already fill the cores. Both halves run; either failing fails.
rc=0
(cd "$root/build" && ctest --output-on-failure -j "${HPCT_UNIT_JOBS:-$(nproc)}" -L unit "$@") || rc=1
(cd "$root/build" && ctest --output-on-failure -j "${HPCT_TEST_JOBS:-1}" -LE unit "$@") || rc=1
if ((rc != 0)); then exit 1; fi
# Then the unit tests under AddressSanitizer + UndefinedBehaviorSanitizer and the fuzz targets
# (Clang, ./build-asan; docs/reliability.md). HPCT_SKIP_SANITIZE=1 leaves them out.
if [[ "${HPCT_SKIP_SANITIZE:-0}" != 1 ]]; then
  bash "$root/scripts/sanitize.sh"
fi
