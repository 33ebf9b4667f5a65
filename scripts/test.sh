#!/usr/bin/env bash
# The README's second command: installs what is missing, builds, fetches the default data and
# runs the whole CTest suite.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/install_deps.sh"
bash "$root/scripts/build.sh"
bash "$root/scripts/fetch_data.sh"
(cd "$root/build" && ctest --output-on-failure -j "${HPCT_TEST_JOBS:-1}" "$@")
# Then the unit tests under AddressSanitizer + UndefinedBehaviorSanitizer and the fuzz targets
# (Clang, ./build-asan; docs/reliability.md). HPCT_SKIP_SANITIZE=1 leaves them out.
if [[ "${HPCT_SKIP_SANITIZE:-0}" != 1 ]]; then
  bash "$root/scripts/sanitize.sh"
fi
