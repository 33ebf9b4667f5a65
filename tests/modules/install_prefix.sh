#!/bin/bash
# install_prefix.sh BUILD_DIR PREFIX APP... - `cmake --install` into a fresh PREFIX and check the
# layout docs/install.md promises: bin/<every app>, share/hpctrain/{slurm,inputs,docs} and one
# modulefile whose paths are PREFIX. The modules and slurm tests use this install.
set -euo pipefail
build=${1:?usage: install_prefix.sh BUILD_DIR PREFIX APP...}
prefix=${2:?usage: install_prefix.sh BUILD_DIR PREFIX APP...}
shift 2
fail() { echo "FAIL: $*"; exit 1; }

rm -rf "${prefix}"
cmake --install "${build}" --prefix "${prefix}"

for app in "$@"; do
  [[ -x "${prefix}/bin/${app}" ]] || fail "bin/${app} not installed"
done
for f in slurm/pretrain_gpt.sbatch slurm/pretrain_moe.sbatch slurm/nvme_bench.sbatch slurm/ib_healthcheck.sbatch \
  slurm/healthcheck_then_train.sh slurm/preprocess_data.sbatch slurm/evaluate.sbatch slurm/sweep.sbatch slurm/README.md \
  inputs/gpt-tiny.args inputs/healthcheck/local.json docs/README.md docs/install.md docs/slurm.md; do
  [[ -e "${prefix}/share/hpctrain/${f}" ]] || fail "share/hpctrain/${f} not installed"
done
for f in "${prefix}"/share/hpctrain/slurm/*.sbatch "${prefix}"/share/hpctrain/slurm/*.sh; do
  [[ -x "${f}" ]] || fail "${f} is not executable"
done

mfs=("${prefix}"/modulefiles/hpctrain/*)
if ((${#mfs[@]} != 1)) || [[ ! -f "${mfs[0]}" ]]; then fail "expected one modulefile in ${prefix}/modulefiles/hpctrain, found: ${mfs[*]}"; fi
mf=${mfs[0]}
head -n 1 "${mf}" | grep -q '^#%Module' || fail "${mf} does not start with #%Module"
grep -q "^set root \"${prefix}\"$" "${mf}" || fail "${mf} does not point at ${prefix}"
grep -q "@[A-Z_]*@" "${mf}" && fail "${mf} has unreplaced @VARIABLES@"
[[ "$(basename "${mf}")" =~ ^[0-9]+\.[0-9]+\.[0-9]+-[a-z]+-[0-9.]+-[a-z]+-[0-9.]+$ ]] ||
  fail "module version '$(basename "${mf}")' is not <version>-<compiler>-<mpi>"
echo "installed to ${prefix}; modulefile ${mf#"${prefix}"/}"
