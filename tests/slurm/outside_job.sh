#!/bin/bash
# outside_job.sh SLURM_DIR - every job template refuses to run outside a Slurm job (exit 2 and a
# line saying to submit it), before it touches anything. Needs no Slurm daemons.
set -euo pipefail
dir=${1:?usage: outside_job.sh SLURM_DIR}
n=0
for t in "${dir}"/*.sbatch; do
  rc=0
  out=$(env -u SLURM_JOB_ID -u SLURM_JOBID bash "${t}" 2>&1) || rc=$?
  if ((rc != 2)) || ! grep -q "not inside a Slurm job; submit it: sbatch" <<<"${out}"; then
    echo "FAIL: $(basename "${t}") outside a job: exit ${rc}, said: ${out}"
    exit 1
  fi
  echo "$(basename "${t}"): ${out}"
  n=$((n + 1))
done
((n >= 3)) || { echo "FAIL: only ${n} templates in ${dir}"; exit 1; }
