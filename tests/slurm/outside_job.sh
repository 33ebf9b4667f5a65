#!/bin/bash
# outside_job.sh SLURM_DIR - every job template refuses to run outside a Slurm job (exit 2 and a
# line saying to submit it), before it touches anything; and every template carries the commented
# account and partition placeholders. Needs no Slurm daemons.
set -euo pipefail
dir=$(cd "${1:?usage: outside_job.sh SLURM_DIR}" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "${scratch}"' EXIT
# The templates that must be there (a renamed or lost one fails here, not silently).
expected=(pretrain_gpt pretrain_moe pretrain_gpt_gpu pretrain_moe_gpu nvme_bench ib_healthcheck preprocess_data evaluate sweep)
for name in "${expected[@]}"; do
  [[ -f "${dir}/${name}.sbatch" ]] || { echo "FAIL: ${dir}/${name}.sbatch is missing"; exit 1; }
done
n=0
for t in "${dir}"/*.sbatch; do
  rc=0
  out=$(cd "${scratch}" && env -u SLURM_JOB_ID -u SLURM_JOBID -u SLURM_ARRAY_TASK_ID bash "${t}" 2>&1) || rc=$?
  if ((rc != 2)) || ! grep -q "not inside a Slurm job; submit it: sbatch" <<<"${out}"; then
    echo "FAIL: $(basename "${t}") outside a job: exit ${rc}, said: ${out}"
    exit 1
  fi
  [[ -z "$(ls -A "${scratch}")" ]] || { echo "FAIL: $(basename "${t}") left files outside a job: $(ls -A "${scratch}")"; exit 1; }
  for opt in account partition; do
    grep -q "^##SBATCH --${opt}=<" "${t}" || { echo "FAIL: $(basename "${t}") has no '##SBATCH --${opt}=<...>' placeholder"; exit 1; }
  done
  echo "$(basename "${t}"): ${out}"
  n=$((n + 1))
done
((n >= ${#expected[@]})) || { echo "FAIL: only ${n} templates in ${dir}"; exit 1; }
