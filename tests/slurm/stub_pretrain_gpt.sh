#!/bin/bash
# stub_pretrain_gpt.sh - stands in for pretrain_gpt in the test of pretrain_gpt.sbatch's
# time-limit logic (trap -> forward USR1 -> save -> requeue -> resume), which the real app cannot
# (quickly, and including the crash-loop limit) with the protocol of docs/checkpoints.md: --save DIR
# writes DIR/latest when USR1 arrives and exits 75 ("saved; requeue me"), --load DIR resumes from
# DIR/latest, --json FILE is written when all iterations are done. It tests the script, not
# training: slurm_requeue_resume_e2e runs the real pretrain_gpt through the same path.
# Knobs (environment): HPCT_STUB_SEGMENT_ITERS=N saves and exits 75 after N iterations of each
# start, as if the time limit came (N=0: at once, no newer checkpoint than the one loaded: a
# restart without progress); HPCT_STUB_ARGV_FILE=F: rank 0 writes its arguments to F, one a line;
# --skip-train: write --json and exit without iterating.
set -euo pipefail
iters=10 save="" load="" json="" skip_train=0
if [[ -n "${HPCT_STUB_ARGV_FILE:-}" && "${SLURM_PROCID:-0}" == 0 ]]; then printf '%s\n' "$@" >"${HPCT_STUB_ARGV_FILE}"; fi
while (($#)); do
  case "$1" in
    --skip-train) skip_train=1 ;;
    --train-iters) iters=$2; shift ;;
    --save) save=$2; shift ;;
    --load) load=$2; shift ;;
    --json) json=$2; shift ;;
  esac
  shift
done
rank=${SLURM_PROCID:-0}
it=0
if [[ -n "${load}" ]]; then
  it=$(<"${load}/latest")
  it=${it#iter_}
  it=$((10#${it%%.*}))
  if ((rank == 0)); then echo "stub: resumed from ${load}/latest at iteration ${it}"; fi
fi
start=${it}
if ((skip_train)); then
  if ((rank == 0)) && [[ -n "${json}" ]]; then
    echo "{\"exit_reason\": \"skip_train\", \"iterations\": ${it}, \"start_iteration\": ${start}}" >"${json}"
  fi
  exit 0
fi
# Like the real save, the ranks leave it together: rank 0 publishes `latest`, the others wait for
# that (the real checkpointer ends the save with a collective). HPCT_STUB_RANK0_EXIT_DELAY=S keeps
# rank 0 alive S seconds after the save, so a peer's exit 75 makes srun end it (exit 143): the
# script must still requeue, since the checkpoint was published.
done_mark=${save:-/nonexistent}/.stub_saved.${SLURM_JOB_ID:-0}.${SLURM_RESTART_COUNT:-0}
# shellcheck disable=SC2317  # reached through the trap
save_and_exit() {
  if ((rank == 0)); then
    if [[ -n "${save}" ]]; then
      echo "iter_${it}" >"${save}/latest.tmp" && mv "${save}/latest.tmp" "${save}/latest"
    fi
    echo "stub: $1 at iteration ${it}: checkpoint saved, exiting"
    if [[ -n "${save}" ]]; then touch "${done_mark}"; fi
    sleep "${HPCT_STUB_RANK0_EXIT_DELAY:-0}" || true
  elif [[ -n "${save}" ]]; then
    for ((w = 0; w < 200; w++)); do
      [[ -e "${done_mark}" ]] && break
      sleep 0.1 || true
    done
  fi
  exit 75
}
trap 'save_and_exit USR1' USR1
while ((it < iters)); do
  if [[ -n "${HPCT_STUB_SEGMENT_ITERS:-}" ]] && ((it - start >= HPCT_STUB_SEGMENT_ITERS)); then
    save_and_exit "end of segment (HPCT_STUB_SEGMENT_ITERS=${HPCT_STUB_SEGMENT_ITERS})"
  fi
  # srun signals the whole task, sleep included: a sleep killed by USR1 must not end the stub
  # (set -e) before bash runs the trap.
  sleep 0.5 || true
  it=$((it + 1))
  if ((rank == 0)); then echo "stub: iteration ${it}/${iters}"; fi
done
if ((rank == 0)) && [[ -n "${json}" ]]; then
  echo "{\"iterations\": ${iters}, \"resumed_from\": ${start}, \"restart\": ${SLURM_RESTART_COUNT:-0}}" >"${json}"
fi
exit 0
