#!/bin/bash
# healthcheck_then_train.sh - submit a health check of the nodes, then a training run that starts
# only if the check ran (--dependency=afterok) and only on the nodes the check found healthy.
#
#   module load hpctrain
#   $HPCTRAIN_HOME/share/hpctrain/slurm/healthcheck_then_train.sh                 # tiny defaults
#   HPCT_HC_NODES=32 HPCT_TRAIN_NODES=30 HPCT_HC_PROFILE=azure-ndv4 \
#     healthcheck_then_train.sh --checks node,allreduce -- --lr 3e-4
#
# Arguments before `--` go to ib_healthcheck, those after it to pretrain_gpt; the HPCT_* variables
# of both templates pass through the environment. Run it where you run sbatch (not in a job).
# Account and partition: both jobs take sbatch's SBATCH_ACCOUNT and SBATCH_PARTITION from the
# environment (or uncomment the placeholders in the two templates):
#   SBATCH_ACCOUNT=<your-account> SBATCH_PARTITION=<partition> healthcheck_then_train.sh
#
# How the training is kept on the healthy nodes: the training job must exist before the check
# ends, and sbatch --exclude is fixed at submission, so
#   1. the check is submitted held (it cannot end before the training job exists),
#   2. the training job is submitted with --dependency=afterok:<check> --kill-on-invalid-dep=yes,
#   3. its ID goes into a file the check reads (HPCT_HC_NEXT_JOB_FILE), and the check is released;
#   4. at its end the check puts every node but the healthy ones it checked (failed nodes and
#      nodes it never ran on) into the training job's ExcNodeList and exits 0; with fewer healthy
#      nodes than HPCT_TRAIN_NODES it cancels the training job, saying so in its log (exit 1); it
#      exits 2 when it could not run, which cancels the training job too.
set -euo pipefail

# ---- inputs ----
HPCT_SLURM_DIR=${HPCT_SLURM_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}   # the templates
HPCT_HC_NODES=${HPCT_HC_NODES:-2}            # nodes to check
HPCT_TRAIN_NODES=${HPCT_TRAIN_NODES:-1}      # nodes to train on (at most HPCT_HC_NODES minus the failures)
HPCT_CHAIN_DIR=${HPCT_CHAIN_DIR:-${PWD}/hpctrain-chain-$(date +%Y%m%d-%H%M%S)-$$}   # run dirs of both jobs

hc_args=()
train_args=()
seen_sep=0
for a in "$@"; do
  if ((seen_sep == 0)) && [[ "${a}" == "--" ]]; then
    seen_sep=1
  elif ((seen_sep)); then
    train_args+=("${a}")
  else
    hc_args+=("${a}")
  fi
done

if ((HPCT_TRAIN_NODES > HPCT_HC_NODES)); then
  echo "healthcheck_then_train.sh: HPCT_TRAIN_NODES=${HPCT_TRAIN_NODES} > HPCT_HC_NODES=${HPCT_HC_NODES}: the training runs only on checked nodes" >&2
  exit 2
fi
mkdir -p "${HPCT_CHAIN_DIR}"
next_job_file=${HPCT_CHAIN_DIR}/training-job-id
hc_job=
cleanup() {
  # Something failed after the check was submitted: do not leave a held job behind.
  if [[ -n "${hc_job}" ]]; then scancel "${hc_job}" 2>/dev/null || true; fi
}
trap cleanup ERR

hc_job=$(HPCT_RUN_DIR="${HPCT_CHAIN_DIR}/healthcheck" HPCT_HC_NEXT_JOB_FILE="${next_job_file}" \
  sbatch --parsable --hold --nodes="${HPCT_HC_NODES}" --chdir="${HPCT_CHAIN_DIR}" \
  "${HPCT_SLURM_DIR}/ib_healthcheck.sbatch" "${hc_args[@]}")
hc_job=${hc_job%%;*}   # --parsable prints ID[;cluster]

train_job=$(HPCT_RUN_DIR="${HPCT_CHAIN_DIR}/training" \
  sbatch --parsable --nodes="${HPCT_TRAIN_NODES}" --chdir="${HPCT_CHAIN_DIR}" \
  --dependency="afterok:${hc_job}" --kill-on-invalid-dep=yes \
  "${HPCT_SLURM_DIR}/pretrain_gpt.sbatch" "${train_args[@]}")
train_job=${train_job%%;*}

echo "${train_job}" >"${next_job_file}"
scontrol release "${hc_job}"
trap - ERR

echo "health check: job ${hc_job} on ${HPCT_HC_NODES} nodes"
echo "training:     job ${train_job} on ${HPCT_TRAIN_NODES} nodes, after ${hc_job} succeeds, on nodes it found healthy"
echo "logs and results: ${HPCT_CHAIN_DIR}"
echo "${hc_job} ${train_job}" >"${HPCT_CHAIN_DIR}/jobs"
