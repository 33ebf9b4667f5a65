#!/usr/bin/env bash
# Configures and builds hpctrain into ./build (Release). Extra arguments go to cmake's configure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=${HPCT_BUILD_JOBS:-$(nproc)}
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$root/build" -j "$jobs"
