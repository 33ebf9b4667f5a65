#!/bin/bash
# cluster.sh up|down BASE [NODES] - a real Slurm on this machine for the `slurm` tests: munged,
# slurmctld and NODES slurmd daemons (emulated nodes n1..nN, all on localhost), config and state
# under BASE (the build tree). No systemd, nothing in /etc is touched; clients find the cluster
# through SLURM_CONF=BASE/etc/slurm.conf. See ../shared/reference/slurm-and-modules-on-one-host.md.
#
# up:   stops a cluster left in BASE, starts a fresh one, waits until every node is idle. When this
#       machine cannot run the daemons (not installed, not root, ports taken, a daemon refuses to
#       start), it writes the reason to BASE/UNAVAILABLE and exits 77 (CTest: skipped), never 0.
# down: cancels the cluster's jobs, `scontrol shutdown`, then waits for each daemon by its pid
#       file (SIGTERM, then SIGKILL); always exits 0. The CTest cleanup fixture runs it also when
#       tests failed.
set -euo pipefail

cmd=${1:?usage: cluster.sh up|down BASE [NODES]}
BASE=${2:?usage: cluster.sh up|down BASE [NODES]}
NODES=${3:-4}
CTLD_PORT=${HPCT_SLURM_CTLD_PORT:-16817}        # not 6817: leave a real slurmctld on this host alone
NODE_PORT0=${HPCT_SLURM_NODE_PORT0:-16820}      # slurmd of node i listens on NODE_PORT0 + i
SKIP=77
export SLURM_CONF=${BASE}/etc/slurm.conf

log() { echo "cluster.sh: $*"; }

# True while PID is alive and not a zombie (kill -0 succeeds on zombies; PID 1 here reaps slowly).
alive() {
  local st
  st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ -n "${st}" && "${st}" != Z* ]]
}

stop_pidfile() {  # PIDFILE NAME GRACE: wait GRACE s for it to exit, then SIGTERM, 10 s more, SIGKILL
  local f=$1 name=$2 grace=$3 pid i
  [[ -s "${f}" ]] || return 0
  pid=$(<"${f}")
  [[ "${pid}" =~ ^[0-9]+$ ]] || return 0
  for ((i = 0; i < grace * 5; i++)); do alive "${pid}" || break; sleep 0.2; done
  if alive "${pid}"; then
    if ((grace > 0)); then log "${name} (${pid}) still up after ${grace} s: SIGTERM"; fi
    kill -TERM "${pid}" 2>/dev/null || true
  fi
  for ((i = 0; i < 50; i++)); do alive "${pid}" || break; sleep 0.2; done
  if alive "${pid}"; then log "${name} (${pid}) ignores SIGTERM: SIGKILL"; kill -KILL "${pid}" 2>/dev/null || true; fi
  rm -f "${f}"
}

down() {
  [[ -d "${BASE}" ]] || return 0
  local grace=0 f i
  if [[ -s "${BASE}/run/slurmctld.pid" ]] && alive "$(<"${BASE}/run/slurmctld.pid")"; then
    # Only this cluster's jobs: the clients talk to the slurmctld of SLURM_CONF.
    scancel --user="$(id -un)" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
      if [[ -z "$(squeue -h -o %i 2>/dev/null)" ]]; then break; fi
      sleep 0.2
    done
    # Stops slurmctld and every slurmd; give them 30 s (saving state can be slow on a busy disk).
    if timeout 20 scontrol shutdown >/dev/null 2>&1; then grace=30; fi
  fi
  for f in "${BASE}"/run/slurmd-*.pid; do
    if [[ -e "${f}" ]]; then stop_pidfile "${f}" "slurmd $(basename "${f}" .pid)" "${grace}"; fi
  done
  stop_pidfile "${BASE}/run/slurmctld.pid" slurmctld "${grace}"
  stop_pidfile "${BASE}/munge/munged.pid" munged 0
  return 0
}

unavailable() {
  mkdir -p "${BASE}"
  echo "$*" >"${BASE}/UNAVAILABLE"
  echo "SKIPPED: this machine cannot run a Slurm cluster: $*"
  exit "${SKIP}"
}

dump_logs() {
  local f
  for f in "${BASE}"/log/*.log "${BASE}"/munge/munged.log; do
    [[ -s "${f}" ]] || continue
    echo "---- ${f} (last 15 lines)"
    tail -n 15 "${f}"
  done
}

up() {
  down
  rm -rf "${BASE}"
  mkdir -p "${BASE}"
  local b
  for b in munged mungekey slurmctld slurmd sbatch srun scontrol sinfo squeue; do
    command -v "${b}" >/dev/null || unavailable "${b} not found (Debian: slurm-wlm, munge; scripts/install_deps.sh installs them)"
  done
  [[ "$(id -u)" == 0 ]] || unavailable "the test cluster runs its daemons as root (SlurmUser=root); this is uid $(id -u)"
  if command -v ss >/dev/null; then
    local p
    for p in "${CTLD_PORT}" $(seq $((NODE_PORT0 + 1)) $((NODE_PORT0 + NODES))); do
      if ss -Hltn "sport = :${p}" | grep -q .; then unavailable "TCP port ${p} is taken (set HPCT_SLURM_CTLD_PORT / HPCT_SLURM_NODE_PORT0)"; fi
    done
  fi

  mkdir -p "${BASE}"/{munge,etc,state,run,log}
  chmod 755 "${BASE}" "${BASE}/munge"    # munged insists that every user can reach its socket
  local i
  for ((i = 1; i <= NODES; i++)); do
    mkdir -p "${BASE}/spool/n${i}" "${BASE}/tmp/n${i}"
    chmod 1777 "${BASE}/tmp/n${i}"
  done
  local sock=${BASE}/munge/munge.socket.2
  ((${#sock} < 100)) || unavailable "the munge socket path is too long for a unix socket: ${sock}"

  mungekey -c -k "${BASE}/munge/munge.key" -b 1024 >/dev/null 2>&1 || unavailable "mungekey failed"
  if ! munged --key-file="${BASE}/munge/munge.key" --socket="${sock}" --pid-file="${BASE}/munge/munged.pid" \
    --log-file="${BASE}/munge/munged.log" --seed-file="${BASE}/munge/munged.seed" 2>"${BASE}/log/munged.err"; then
    unavailable "munged refused to start: $(tr '\n' ' ' <"${BASE}/log/munged.err")"
  fi
  munge -S "${sock}" -n | unmunge -S "${sock}" >/dev/null 2>&1 || { down; unavailable "munge round trip failed"; }

  # Node shape from slurmd -C (what slurmd will find), memory capped so N nodes fit in this one.
  local shape mem_mb
  shape=$(slurmd -C | head -n 1 | grep -o 'CPUs=[0-9]* Boards=[0-9]* SocketsPerBoard=[0-9]* CoresPerSocket=[0-9]* ThreadsPerCore=[0-9]*') ||
    { down; unavailable "slurmd -C did not describe this machine"; }
  mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.8 / '"${NODES}"')}' /proc/meminfo)
  if ((mem_mb > 4000)); then mem_mb=4000; fi

  {
    echo "# Generated by tests/slurm/cluster.sh: ${NODES} emulated nodes on localhost."
    echo "ClusterName=hpcttest"
    echo "SlurmctldHost=localhost"
    echo "SlurmctldPort=${CTLD_PORT}"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "# cred_expire: a requeued job waits this long before it starts again (default 120 s)."
    echo "AuthInfo=socket=${sock},cred_expire=10"
    echo "StateSaveLocation=${BASE}/state"
    echo "SlurmdSpoolDir=${BASE}/spool/%n"
    echo "# Per node: srun --mpi=pmix puts its per-step directory here; shared, emulated nodes collide."
    echo "TmpFS=${BASE}/tmp/%n"
    echo "SlurmctldPidFile=${BASE}/run/slurmctld.pid"
    echo "SlurmdPidFile=${BASE}/run/slurmd-%n.pid"
    echo "SlurmctldLogFile=${BASE}/log/slurmctld.log"
    echo "SlurmdLogFile=${BASE}/log/slurmd-%n.log"
    echo "SlurmctldDebug=info"
    echo "SlurmdDebug=info"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/affinity   # srun --cpu-bind pins tasks (no cgroups needed)"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobCompType=jobcomp/filetxt"
    echo "JobCompLoc=${BASE}/log/jobcomp.txt"
    echo "SchedulerType=sched/backfill"
    echo "# A requeued job becomes eligible after cred_expire, and only a periodic pass starts it:"
    echo "# every second here (the defaults, 60 s and backfill's 30 s, left it pending 20-36 s)."
    echo "SchedulerParameters=batch_sched_delay=0,sched_interval=1,bf_interval=1"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "MpiDefault=pmix"
    echo "ReturnToService=2"
    echo "MailProg=/bin/true"
    echo "InactiveLimit=0"
    echo "KillWait=5"
    echo "MinJobAge=300"
    echo "SlurmdTimeout=60"
    echo "Waittime=0"
    for ((i = 1; i <= NODES; i++)); do
      echo "NodeName=n${i} NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((NODE_PORT0 + i)) ${shape} RealMemory=${mem_mb} State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=n[1-${NODES}] Default=YES DefaultTime=00:05:00 MaxTime=00:30:00 State=UP"
  } >"${SLURM_CONF}"

  if ! slurmctld -f "${SLURM_CONF}" 2>"${BASE}/log/slurmctld.err"; then
    dump_logs; down; unavailable "slurmctld refused to start: $(tr '\n' ' ' <"${BASE}/log/slurmctld.err")"
  fi
  for ((i = 0; i < 150; i++)); do
    scontrol ping 2>/dev/null | grep -q "is UP" && break
    sleep 0.2
  done
  scontrol ping 2>/dev/null | grep -q "is UP" || { dump_logs; down; unavailable "slurmctld did not answer within 30 s"; }
  for ((i = 1; i <= NODES; i++)); do
    if ! slurmd -N "n${i}" -f "${SLURM_CONF}" 2>"${BASE}/log/slurmd-n${i}.err"; then
      dump_logs; down; unavailable "slurmd -N n${i} refused to start: $(tr '\n' ' ' <"${BASE}/log/slurmd-n${i}.err")"
    fi
  done
  local idle=0
  for ((i = 0; i < 300; i++)); do
    idle=$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
    ((idle == NODES)) && break
    sleep 0.2
  done
  if ((idle != NODES)); then
    sinfo -N -l || true
    dump_logs; down; unavailable "only ${idle} of ${NODES} nodes became idle within 60 s"
  fi
  rm -f "${BASE}/UNAVAILABLE"
  log "up: ${NODES} nodes idle; export SLURM_CONF=${SLURM_CONF}"
  sinfo -N
}

case "${cmd}" in
  up) up ;;
  down) down; log "down" ;;
  *) echo "usage: cluster.sh up|down BASE [NODES]" >&2; exit 2 ;;
esac
