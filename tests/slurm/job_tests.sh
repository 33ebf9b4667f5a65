#!/bin/bash
# job_tests.sh CASE - submits the installed job templates to the test cluster (cluster.sh) the way
# a user does: a clean shell, `module load hpctrain` (Environment Modules), sbatch from a work
# directory; waits for the jobs and checks their logs and result files.
#
# Environment (set by tests/slurm/CMakeLists.txt): HPCT_TEST_CLUSTER (cluster.sh's BASE),
# HPCT_TEST_PREFIX (the install prefix of the hpct_install_prefix fixture), HPCT_TEST_WORK (this
# test's scratch directory), HPCT_SOURCE_DIR.
# Exit: 0 pass, 1 fail, 77 skipped (no cluster on this machine, or a feature that is not there yet).
set -euo pipefail

case_name=${1:?usage: job_tests.sh CASE}
BASE=${HPCT_TEST_CLUSTER:?}
PREFIX=${HPCT_TEST_PREFIX:?}
WORK=${HPCT_TEST_WORK:?}
SRC=${HPCT_SOURCE_DIR:?}
SKIP=77
export SLURM_CONF=${BASE}/etc/slurm.conf
SLURM_DIR=${PREFIX}/share/hpctrain/slurm

fail() { echo "FAIL: $*"; exit 1; }
skip() { echo "SKIPPED: $*"; exit "${SKIP}"; }

if [[ -e "${BASE}/UNAVAILABLE" ]]; then skip "no Slurm on this machine: $(<"${BASE}/UNAVAILABLE")"; fi
[[ -e "${SLURM_CONF}" ]] || fail "no test cluster in ${BASE} (the slurm_cluster_up fixture did not run)"
scontrol ping 2>/dev/null | grep -q "is UP" || fail "the test cluster's slurmctld does not answer"
[[ -x "${PREFIX}/bin/pretrain_gpt" ]] || fail "no install in ${PREFIX} (the hpct_install_prefix fixture did not run)"

rm -rf "${WORK}"
mkdir -p "${WORK}/home"

# Runs "$@" in a clean login-like shell that loaded the hpctrain module, from WORK. sbatch exports
# that environment into the job, as it does for a user (--export=ALL).
# shellcheck disable=SC2016  # $1.. expand in the inner shell
as_user() {
  env -i HOME="${WORK}/home" PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 SLURM_CONF="${SLURM_CONF}" \
    bash -c 'set -e; . /usr/share/modules/init/bash; module use "$1/modulefiles"; module load hpctrain; cd "$2"; shift 2; "$@"' \
    _ "${PREFIX}" "${WORK}" "$@"
}

# As as_user, but with the module path only: the job template loads the module itself (HPCT_MODULE).
# shellcheck disable=SC2016  # $1.. expand in the inner shell
as_user_no_module() {
  env -i HOME="${WORK}/home" PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 SLURM_CONF="${SLURM_CONF}" \
    bash -c 'set -e; . /usr/share/modules/init/bash; module use "$1/modulefiles"; cd "$2"; shift 2; "$@"' \
    _ "${PREFIX}" "${WORK}" "$@"
}

job_field() {  # JOBID FIELD -> value from scontrol show job
  scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

# Waits until JOBID is in a final state (or, with a third argument, in that state); prints it.
wait_job() {
  local id=$1 limit=$2 want=${3:-} st="" i
  for ((i = 0; i < limit * 5; i++)); do
    st=$(job_field "${id}" JobState)
    if [[ -n "${want}" ]]; then
      [[ "${st}" == "${want}" ]] && break
    else
      case "${st}" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED) break ;; esac
    fi
    sleep 0.2
  done
  echo "${st}"
}

show_log() {
  local f
  for f in "$@"; do
    echo "---- ${f}"
    if [[ -e "${f}" ]]; then tail -n 40 "${f}"; else echo "(missing)"; fi
  done
}

expect_in() {  # FILE REGEX
  grep -Eq -- "$2" "$1" || { show_log "$1"; fail "$1 lacks /$2/"; }
}

json_check() {  # FILE PYTHON-EXPRESSION over j
  python3 - "$1" "$2" <<'EOF' || fail "$1: check failed: $2"
import json, math, sys
j = json.load(open(sys.argv[1]))
ok = eval(sys.argv[2], {"math": math}, {"j": j})
print(f"{sys.argv[1]}: {sys.argv[2]} -> {ok}")
sys.exit(0 if ok else 1)
EOF
}

module_version() {
  local f
  for f in "${PREFIX}"/modulefiles/hpctrain/*; do basename "${f}"; return; done
}

case "${case_name}" in
  pretrain_gpt)
    # As it is, no argument: tiny GPT on mock data, 1 node x 2 ranks.
    id=$(as_user sbatch --parsable "${SLURM_DIR}/pretrain_gpt.sbatch")
    st=$(wait_job "${id}" 240)
    out=${WORK}/pretrain_gpt-${id}.out
    [[ "${st}" == COMPLETED ]] || { show_log "${out}"; fail "job ${id} ended ${st:-in no state}, exit $(job_field "${id}" ExitCode)"; }
    expect_in "${out}" "^# job ${id} \\(pretrain_gpt\\)"
    expect_in "${out}" "^# nodes 1: n[0-9]"
    expect_in "${out}" "^# hpctrain [0-9.]+ at ${PREFIX}"
    expect_in "${out}" "srun --mpi=pmix"
    expect_in "${out}" "iteration +20/ +20"
    expect_in "${out}" "pretrain_gpt exited with 0"
    run=${WORK}/pretrain_gpt-${id}
    json_check "${run}/summary.json" 'j["iterations"] == 20 and j["world_size"] == 2 and math.isfinite(j["final_lm_loss"])'
    [[ -s "${run}/metrics.jsonl" ]] || fail "no metrics in ${run}"
    ;;

  nvme_bench)
    # The job loads the module itself (HPCT_MODULE), on a scratch directory of this test.
    mkdir -p "${WORK}/scratch"
    ver=$(module_version)
    id=$(as_user_no_module env HPCT_MODULE="hpctrain/${ver}" HPCT_NVME_PATH="${WORK}/scratch" \
      sbatch --parsable "${SLURM_DIR}/nvme_bench.sbatch")
    st=$(wait_job "${id}" 120)
    out=${WORK}/nvme_bench-${id}.out
    [[ "${st}" == COMPLETED ]] || { show_log "${out}"; fail "job ${id} ended ${st:-in no state}, exit $(job_field "${id}" ExitCode)"; }
    expect_in "${out}" "^# hpctrain [0-9.]+ at ${PREFIX}"
    expect_in "${out}" "^# path ${WORK}/scratch, size 64M"
    json_check "${WORK}/nvme_bench-${id}/nvme_bench.json" \
      'j["result"] == "OK" and [c["mode"] for c in j["cases"]] == ["write", "read"] and all(c["bandwidth_MBps"] > 0 and c["bytes"] == 64 << 20 for c in j["cases"])'
    [[ -z "$(ls -A "${WORK}/scratch")" ]] || fail "nvme_bench left files in ${WORK}/scratch"
    ;;

  ib_healthcheck)
    # As it is, no argument: every check of 2 nodes with the 'local' profile; healthy.
    [[ -x "${PREFIX}/bin/ib_healthcheck" ]] || skip "ib_healthcheck is not built"
    id=$(as_user sbatch --parsable "${SLURM_DIR}/ib_healthcheck.sbatch")
    st=$(wait_job "${id}" 180)
    out=${WORK}/ib_healthcheck-${id}.out
    [[ "${st}" == COMPLETED ]] || { show_log "${out}"; fail "job ${id} ended ${st:-in no state}, exit $(job_field "${id}" ExitCode)"; }
    expect_in "${out}" "^# nodes 2: n[0-9] n[0-9]$"
    expect_in "${out}" "ib_healthcheck exited with 0; failed nodes: none"
    json_check "${WORK}/ib_healthcheck-${id}/report.json" 'isinstance(j, dict)'
    [[ ! -s "${WORK}/ib_healthcheck-${id}/exclude-nodes.txt" || "$(tr -d ' \n' <"${WORK}/ib_healthcheck-${id}/exclude-nodes.txt")" == "" ]] ||
      fail "a healthy check excluded nodes: $(<"${WORK}/ib_healthcheck-${id}/exclude-nodes.txt")"
    ;;

  healthcheck_drain)
    # 4 emulated nodes, rank 1 (node n2) made 20x slow: n2 ends up DRAINED with the reason, the
    # others stay IDLE.
    [[ -x "${PREFIX}/bin/ib_healthcheck" ]] || skip "ib_healthcheck is not built"
    trap 'scontrol update NodeName=n2 State=RESUME >/dev/null 2>&1 || true' EXIT
    id=$(as_user env HPCT_HC_DRAIN=1 sbatch --parsable --nodes=4 "${SLURM_DIR}/ib_healthcheck.sbatch" \
      --checks node,mpi_p2p --lat-iters 300 --bw-iters 5 -w 8 -s 256K --inject-fault slow:1:mpi_p2p)
    st=$(wait_job "${id}" 180)
    out=${WORK}/ib_healthcheck-${id}.out
    show_log "${out}"
    [[ "${st}" == FAILED ]] || fail "job ${id} ended ${st:-in no state}: expected FAILED (exit 1: a node failed)"
    expect_in "${out}" "ib_healthcheck exited with 1; failed nodes: n2$"
    expect_in "${out}" "^scontrol update NodeName=n2 State=DRAIN"
    [[ "$(<"${WORK}/ib_healthcheck-${id}/exclude-nodes.txt")" == n2 ]] || fail "exclude file is not 'n2'"
    sinfo -N -o "%N %T %E"
    [[ "$(sinfo -h -n n2 -o %T)" == drained ]] || fail "n2 is $(sinfo -h -n n2 -o %T), not drained"
    sinfo -h -R -n n2 -o %E | grep -q "ib_healthcheck" || fail "n2's drain reason lacks ib_healthcheck: $(sinfo -h -R -n n2 -o %E)"
    for n in n1 n3 n4; do
      [[ "$(sinfo -h -n "${n}" -o %T)" == idle ]] || fail "${n} is $(sinfo -h -n "${n}" -o %T), not idle"
    done
    echo "n2 drained with reason: $(sinfo -h -R -n n2 -o %E)"
    ;;

  healthcheck_dying_rank)
    # 3 nodes, rank 1 (the allocation's second node) exits in the middle of mpi_p2p. srun keeps the other
    # tasks running; they time out on it, rank 0 names that node in the report and the job fails (exit
    # 1) instead of hanging. (Under mpirun, Open MPI 4.1 ends the whole job at once: no report.)
    [[ -x "${PREFIX}/bin/ib_healthcheck" ]] || skip "ib_healthcheck is not built"
    id=$(as_user sbatch --parsable --nodes=3 "${SLURM_DIR}/ib_healthcheck.sbatch" \
      --checks node,mpi_p2p --lat-iters 300 --bw-iters 5 -w 8 -s 256K -t 3 --inject-fault die:1:mpi_p2p)
    st=$(wait_job "${id}" 180)
    out=${WORK}/ib_healthcheck-${id}.out
    show_log "${out}"
    [[ "${st}" == FAILED ]] || fail "job ${id} ended ${st:-in no state}: expected FAILED (exit 1: a node failed)"
    # Rank 1 runs on the allocation's second node (which nodes Slurm gives depends on their state).
    dead=$(sed -n 's/^# nodes 3: [^ ]* \([^ ]*\) [^ ]*$/\1/p' "${out}")
    [[ -n "${dead}" ]] || fail "no '# nodes 3: ...' line in ${out}"
    expect_in "${out}" "${dead} +UNHEALTHY +mpi_p2p: stopped responding"
    expect_in "${out}" "ib_healthcheck exited with 1; failed nodes: ${dead}$"
    json_check "${WORK}/ib_healthcheck-${id}/report.json" "'${dead}' in str(j)"
    ;;

  healthcheck_then_train)
    [[ -x "${PREFIX}/bin/ib_healthcheck" ]] || skip "ib_healthcheck is not built"
    # 1) n2 fails the check: the training runs after it, with n2 excluded.
    as_user env HPCT_HC_NODES=4 HPCT_TRAIN_ITERS=4 HPCT_CHAIN_DIR="${WORK}/chain1" \
      "${SLURM_DIR}/healthcheck_then_train.sh" --checks node,mpi_p2p --lat-iters 300 --bw-iters 5 -w 8 -s 256K --inject-fault slow:1:mpi_p2p
    read -r hc train <"${WORK}/chain1/jobs"
    st=$(wait_job "${train}" 240)
    show_log "${WORK}/chain1/ib_healthcheck-${hc}.out" "${WORK}/chain1/pretrain_gpt-${train}.out"
    [[ "$(job_field "${hc}" JobState)" == COMPLETED ]] || fail "health check ${hc}: $(job_field "${hc}" JobState)"
    [[ "${st}" == COMPLETED ]] || fail "training ${train} ended ${st:-in no state}"
    [[ "$(job_field "${train}" ExcNodeList)" == n2 ]] || fail "training ExcNodeList=$(job_field "${train}" ExcNodeList), expected n2"
    [[ "$(job_field "${train}" NodeList)" != n2 ]] || fail "training ran on n2"
    expect_in "${WORK}/chain1/ib_healthcheck-${hc}.out" "job ${train} will not run on: n2"
    json_check "${WORK}/chain1/training/summary.json" 'j["iterations"] == 4'
    echo "chain 1: check ${hc} failed n2, training ${train} ran on $(job_field "${train}" NodeList)"
    # 2) the check cannot run (no such profile): the training is cancelled, never started.
    as_user env HPCT_HC_PROFILE=/nonexistent/profile.json HPCT_CHAIN_DIR="${WORK}/chain2" \
      "${SLURM_DIR}/healthcheck_then_train.sh"
    read -r hc train <"${WORK}/chain2/jobs"
    wait_job "${hc}" 120 >/dev/null
    st=$(wait_job "${train}" 60)
    [[ "$(job_field "${hc}" JobState)" == FAILED ]] || fail "health check ${hc}: $(job_field "${hc}" JobState), expected FAILED"
    [[ "${st}" == CANCELLED ]] || fail "training ${train} is ${st}, expected CANCELLED after a failed check"
    [[ ! -e "${WORK}/chain2/training" ]] || fail "training ${train} started after a failed check"
    echo "chain 2: check ${hc} could not run, training ${train} ${st}"
    ;;

  requeue_logic)
    # pretrain_gpt.sbatch's time-limit path with a stub app (tests/slurm/stub_pretrain_gpt.sh):
    # USR1 to the batch shell (as --signal=B:USR1 sends it) -> forwarded through srun -> the
    # stub saves `latest` and exits 75 -> the script requeues -> the rerun resumes and completes;
    # and the restart limit.
    stub=${WORK}/stub_pretrain_gpt
    install -m 755 "${SRC}/tests/slurm/stub_pretrain_gpt.sh" "${stub}"
    # Rank 0 lingers after the save, so srun ends it when rank 1 exits 75 (the race CI once hit):
    # the step reports 143, and the script must requeue on the published checkpoint.
    id=$(as_user env PRETRAIN_GPT="${stub}" HPCT_CHECKPOINTING=1 HPCT_TRAIN_ITERS=16 HPCT_STUB_RANK0_EXIT_DELAY=20 \
      sbatch --parsable "${SLURM_DIR}/pretrain_gpt.sbatch")
    out=${WORK}/pretrain_gpt-${id}.out
    for ((i = 0; i < 300; i++)); do
      grep -q "stub: iteration 3/" "${out}" 2>/dev/null && break
      sleep 0.2
    done
    grep -q "stub: iteration 3/" "${out}" || { show_log "${out}"; fail "the stub did not start"; }
    scancel --signal=USR1 --batch "${id}"
    st=$(wait_job "${id}" 60 PENDING)
    [[ "${st}" == PENDING && "$(job_field "${id}" Restarts)" == 1 ]] ||
      { show_log "${out}"; fail "job ${id} not requeued: ${st}, Restarts=$(job_field "${id}" Restarts)"; }
    # A requeued job starts again after cred_expire (10 s on the test cluster, 120 s by default);
    # forcing it earlier (StartTime=now) makes slurmd refuse it: "Job credential revoked".
    st=$(wait_job "${id}" 120)
    show_log "${out}"
    [[ "${st}" == COMPLETED ]] || fail "job ${id} ended ${st} after the requeue"
    expect_in "${out}" "forwarding USR1 to the ranks"
    expect_in "${out}" "stub: USR1 at iteration [0-9]+: checkpoint saved"
    expect_in "${out}" "exit 1[0-9][0-9] is srun ending ranks after a peer's exit 75: iter_[0-9]+ was published after USR1"
    expect_in "${out}" "requeueing: restart 1 of at most 3"
    expect_in "${out}" "^# job ${id} \\(pretrain_gpt\\), start 2"
    expect_in "${out}" "resuming from .*/checkpoints \\(iter_[0-9]+\\)"
    json_check "${WORK}/pretrain_gpt-${id}/summary.json" 'j["iterations"] == 16 and j["resumed_from"] >= 3 and j["restart"] == 1'
    # HPCT_MAX_RESTARTS=0: the same signal ends the job instead of requeueing it (no crash loop).
    id=$(as_user env PRETRAIN_GPT="${stub}" HPCT_CHECKPOINTING=1 HPCT_TRAIN_ITERS=40 HPCT_MAX_RESTARTS=0 \
      sbatch --parsable "${SLURM_DIR}/pretrain_gpt.sbatch")
    out=${WORK}/pretrain_gpt-${id}.out
    for ((i = 0; i < 300; i++)); do
      grep -q "stub: iteration 2/" "${out}" 2>/dev/null && break
      sleep 0.2
    done
    scancel --signal=USR1 --batch "${id}"
    st=$(wait_job "${id}" 60)
    [[ "${st}" == FAILED && "$(job_field "${id}" Restarts)" == 0 ]] ||
      { show_log "${out}"; fail "max restarts 0: job ${id} is ${st}, Restarts=$(job_field "${id}" Restarts)"; }
    expect_in "${out}" "stopped early again after 0 restarts \\(HPCT_MAX_RESTARTS\\): not requeueing"
    ;;

  requeue_resume_e2e)
    # The issue's test: a training job is signalled, saves, requeues, resumes, and ends with the
    # same final loss as an uninterrupted run. Needs pretrain_gpt's --save/--load (issue 4).
    if ! grep -q -- "--save" <<<"$("${PREFIX}/bin/pretrain_gpt" --help 2>&1)"; then  # not a pipe: see module_check.sh
      skip "pretrain_gpt has no --save/--load yet (issue 4)"
    fi
    common=(HPCT_TRAIN_ITERS=60 HPCT_LOG_INTERVAL=1 HPCT_CHECKPOINTING=1 HPCT_SAVE_INTERVAL=1000)
    ref=$(as_user env "${common[@]}" HPCT_RUN_DIR="${WORK}/ref" sbatch --parsable "${SLURM_DIR}/pretrain_gpt.sbatch")
    [[ "$(wait_job "${ref}" 300)" == COMPLETED ]] || fail "uninterrupted run ${ref} failed"
    id=$(as_user env "${common[@]}" HPCT_RUN_DIR="${WORK}/cut" sbatch --parsable "${SLURM_DIR}/pretrain_gpt.sbatch")
    out=${WORK}/pretrain_gpt-${id}.out
    for ((i = 0; i < 600; i++)); do
      grep -Eq "iteration +10/" "${out}" 2>/dev/null && break
      sleep 0.2
    done
    scancel --signal=USR1 --batch "${id}"
    [[ "$(wait_job "${id}" 120 PENDING)" == PENDING ]] || { show_log "${out}"; fail "job ${id} was not requeued"; }
    [[ "$(wait_job "${id}" 300)" == COMPLETED ]] || { show_log "${out}"; fail "job ${id} did not complete after the requeue"; }
    show_log "${out}"
    expect_in "${out}" "pretrain_gpt exited with (75|1[0-9][0-9])"
    expect_in "${out}" "requeueing: restart 1 of at most 3"
    expect_in "${out}" "^# job ${id} \\(pretrain_gpt\\), start 2"
    expect_in "${out}" "resuming from"
    python3 - "${WORK}/ref/summary.json" "${WORK}/cut/summary.json" <<'EOF' || fail "the resumed run does not end as the uninterrupted one"
import json, sys
ref, cut = (json.load(open(p)) for p in sys.argv[1:])
print(f"uninterrupted: final lm loss {ref['final_lm_loss']!r} at iteration {ref['iterations']}")
print(f"signalled, requeued, resumed from iteration {cut.get('start_iteration')}: final lm loss {cut['final_lm_loss']!r}")
ok = cut["final_lm_loss"] == ref["final_lm_loss"] and cut["iterations"] == ref["iterations"] == 60
ok = ok and cut.get("start_iteration", 0) > 0
sys.exit(0 if ok else 1)
EOF
    ;;

  *) fail "unknown case ${case_name}" ;;
esac
echo "PASS: ${case_name}"
