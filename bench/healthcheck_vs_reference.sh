#!/usr/bin/env bash
# healthcheck_vs_reference.sh — ib_healthcheck's point-to-point and all-reduce figures next to the
# reference tools from Debian on this machine: ucx_perftest (ucx-utils; UCP tag_lat / tag_bw, server
# and client on localhost) for the UCX probes, NetPIPE's NPmpi (netpipe-openmpi: NPopenmpi, 2 ranks)
# for the MPI probes. Same message sizes, same transport (whatever UCX / Open MPI pick on one host:
# shared memory here), both sides pinned to cores 0 and 1. Programs alternate within each round and
# the medians of ROUNDS rounds are compared (timings on the 2-core machines swing 20-40%).
#
#   bench/healthcheck_vs_reference.sh [ROUNDS=3] [BW_SIZE=4M] [AR_SIZE=64M]
#   HC=build/apps/ib_healthcheck/ib_healthcheck bench/healthcheck_vs_reference.sh 5
#
# The bar (issue 6): latency within 10% of the reference (ours <= 1.10 x theirs), bandwidth >= 90%
# of the reference, all-reduce bus bandwidth at AR_SIZE >= 80% of the point-to-point bandwidth
# ib_healthcheck measured at the same size in the same launch (the median over rounds of each
# launch's ratio; the ratio of the two medians is printed beside it). Prints every round, the medians, the
# ratios and PASS/MISS per bar; exits 0 when every bar is met, 1 otherwise.
#
# Definitions compared (docs/healthcheck.md): ib_healthcheck's latency is the median over batches
# of 50 ping-pongs of the batch's mean half round trip, a mean; it is held against ucx_perftest's
# "avg" column (mean half round trip over all iterations) and NetPIPE's usec column (the best of
# its trials' mean half round trips); ucx_perftest's 50%ile (median of per-iteration samples) is
# printed beside it, without a bar; bandwidth:
# ucx_perftest tag_bw average MB/s (a stream of sends), NetPIPE -s (streaming, one direction),
# ib_healthcheck's window scheme (OSU's; bytes of a window / median window time) one direction,
# median of the two directions.
set -euo pipefail

ROUNDS=${1:-3}
BW_SIZE=${2:-4M}
AR_SIZE=${3:-64M}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
HC=${HC:-${ROOT}/build/apps/ib_healthcheck/ib_healthcheck}
LAT_ITERS=${LAT_ITERS:-20000}
PORT=${PORT:-13377}
MPIRUN=(mpirun -np 2 --bind-to core --map-by core)
if [[ $(id -u) == 0 ]]; then MPIRUN+=(--allow-run-as-root); fi
export OMP_NUM_THREADS=1

for tool in ucx_perftest NPopenmpi "$HC"; do
  if ! command -v "$tool" >/dev/null 2>&1 && [[ ! -x "$tool" ]]; then
    echo "healthcheck_vs_reference.sh: $tool not found (scripts/install_deps.sh --bench; build ib_healthcheck)" >&2
    exit 2
  fi
done
bytes() { python3 -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$1"; }
BW_BYTES=$(bytes "$BW_SIZE")
AR_BYTES=$(bytes "$AR_SIZE")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

echo "# healthcheck_vs_reference: $(date -u +%Y-%m-%dT%H:%M:%SZ) host $(hostname) cpus $(nproc --all)"
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); ucx $(ucx_info -v | sed -n "s/^# Version //p" | head -1); $(mpirun --version | head -1)"
echo "# git $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown); rounds $ROUNDS; latency 8 B x $LAT_ITERS; bandwidth $BW_BYTES B; all-reduce $AR_BYTES B"

# ucx_perftest: server in the background, client prints the final line; echo one column.
# Final line columns: iterations, lat 50%ile, lat avg, lat overall, bw avg MB/s, bw overall, rate avg, rate overall.
ucx_pair() {  # test size iters warmup column
  ucx_perftest -p "$PORT" -c 0 >"$TMP/ucx_server.log" 2>&1 &
  local spid=$!
  sleep 0.5
  local line
  line=$(ucx_perftest localhost -p "$PORT" -c 1 -t "$1" -s "$2" -n "$3" -w "$4" -f 2>&1 | tail -1)
  wait "$spid" || true
  echo "$line" | awk -v c="$5" '{print $c}'
}
ucx_lat() { ucx_pair tag_lat 8 "$LAT_ITERS" 2000 2; }                                  # us, 50%ile
ucx_lat_avg() { ucx_pair tag_lat 8 "$LAT_ITERS" 2000 3; }                              # us, average
ucx_bw() { ucx_pair tag_bw "$BW_BYTES" 2000 100 5 | awk '{printf "%.3f\n", $1 * 1e6 / 1e9}'; }  # GB/s
# NetPIPE: one size (-l = -u), no perturbation; output file: bytes, Mbps, seconds (half round trip).
np_run() {  # extra-flags size column
  # shellcheck disable=SC2086
  "${MPIRUN[@]}" NPopenmpi $1 -l "$2" -u "$2" -p 0 -o "$TMP/np.out" >"$TMP/np.log" 2>&1
  awk -v c="$3" 'NR==1 {print $c}' "$TMP/np.out"
}
np_lat() { np_run "" 8 3 | awk '{printf "%.4f\n", $1 * 1e6}'; }                             # s -> us
np_bw() { np_run "-s" "$BW_BYTES" 2 | awk '{printf "%.3f\n", $1 * 1e6 / 8 / 1e9}'; }      # Mbps -> GB/s
# ib_healthcheck: p2p over MPI and UCX, then all-reduce next to p2p at AR_SIZE; figures from --json.
hc_p2p() {
  "${MPIRUN[@]}" "$HC" -p local --emulate-nodes -q -c mpi_p2p,ucx_p2p --lat-size 8 --lat-iters "$LAT_ITERS" \
    -s "$BW_BYTES" --bw-iters 50 -w 16 --json "$TMP/hc.json" >"$TMP/hc.log" 2>&1
  python3 - "$TMP/hc.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
m, u = j["checks"]["mpi_p2p"]["medians"], j["checks"]["ucx_p2p"]["medians"]
print(m["latency_us"], m["bandwidth_GBps"], u["latency_us"], u["bandwidth_GBps"])
PY
}
hc_ar() {
  "${MPIRUN[@]}" "$HC" -p local --emulate-nodes -q -c mpi_p2p,allreduce --lat-iters 1000 -s "$AR_BYTES" --bw-iters 4 -w 2 \
    -b "$AR_BYTES" -e "$AR_BYTES" -n 10 --json "$TMP/ar.json" >"$TMP/ar.log" 2>&1
  python3 - "$TMP/ar.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(j["checks"]["allreduce"]["rows"][-1]["busbw"], j["checks"]["mpi_p2p"]["medians"]["bandwidth_GBps"])
PY
}

declare -A F
add() { F[$1]="${F[$1]:-} $2"; }
for ((r = 1; r <= ROUNDS; r++)); do
  if ((r % 2 == 1)); then order="ref hc"; else order="hc ref"; fi
  for who in $order; do
    if [[ $who == ref ]]; then
      a=$(ucx_lat); a2=$(ucx_lat_avg); b=$(ucx_bw); c=$(np_lat); d=$(np_bw)
      add ucx_lat_ref "$a"; add ucx_lat_avg_ref "$a2"; add ucx_bw_ref "$b"; add mpi_lat_ref "$c"; add mpi_bw_ref "$d"
      echo "round $r reference: ucx_perftest lat $a us (50%ile), $a2 us (avg), bw $b GB/s; NPmpi lat $c us, bw $d GB/s"
    else
      read -r ml mb ul ub < <(hc_p2p)
      read -r arb p2p < <(hc_ar)
      add mpi_lat_hc "$ml"; add mpi_bw_hc "$mb"; add ucx_lat_hc "$ul"; add ucx_bw_hc "$ub"
      add ar_busbw "$arb"; add ar_p2p "$p2p"
      printf -v ml '%.4f' "$ml"; printf -v mb '%.3f' "$mb"; printf -v ul '%.4f' "$ul"; printf -v ub '%.3f' "$ub"
      printf -v arb '%.3f' "$arb"; printf -v p2p '%.3f' "$p2p"
      echo "round $r ib_healthcheck: mpi lat $ml us, bw $mb GB/s; ucx lat $ul us, bw $ub GB/s; allreduce busbw $arb GB/s vs p2p $p2p GB/s at $AR_BYTES B"
    fi
  done
done

python3 - "$ROUNDS" <<PY
import statistics as st
F = {k: [float(x) for x in v.split()] for k, v in {
  "ucx_lat_ref": "${F[ucx_lat_ref]}", "ucx_lat_avg_ref": "${F[ucx_lat_avg_ref]}", "ucx_bw_ref": "${F[ucx_bw_ref]}", "mpi_lat_ref": "${F[mpi_lat_ref]}",
  "mpi_bw_ref": "${F[mpi_bw_ref]}", "mpi_lat_hc": "${F[mpi_lat_hc]}", "mpi_bw_hc": "${F[mpi_bw_hc]}",
  "ucx_lat_hc": "${F[ucx_lat_hc]}", "ucx_bw_hc": "${F[ucx_bw_hc]}", "ar_busbw": "${F[ar_busbw]}", "ar_p2p": "${F[ar_p2p]}"}.items()}
med = {k: st.median(v) for k, v in F.items()}
rows = [
  ("UCX latency 8 B (us)", "ucx_perftest tag_lat avg (a mean, as ours)", med["ucx_lat_hc"], med["ucx_lat_avg_ref"], "lat"),
  ("UCX latency 8 B (us)", "ucx_perftest tag_lat 50%ile (per-iteration median; not a bar)", med["ucx_lat_hc"], med["ucx_lat_ref"], "info"),
  ("UCX bandwidth $BW_BYTES B (GB/s)", "ucx_perftest tag_bw", med["ucx_bw_hc"], med["ucx_bw_ref"], "bw"),
  ("MPI latency 8 B (us)", "NPmpi", med["mpi_lat_hc"], med["mpi_lat_ref"], "lat"),
  ("MPI bandwidth $BW_BYTES B (GB/s)", "NPmpi -s", med["mpi_bw_hc"], med["mpi_bw_ref"], "bw"),
  ("all-reduce busbw $AR_BYTES B (GB/s)", "ib_healthcheck MPI p2p at $AR_BYTES B, same launch (ratio: median of the rounds' ratios)", med["ar_busbw"], med["ar_p2p"], "ar"),
  ("all-reduce busbw $AR_BYTES B (GB/s)", "the same, ratio of the two medians (not a bar)", med["ar_busbw"], med["ar_p2p"], "info"),
]
# Both all-reduce figures of a round come from one launch of ib_healthcheck: their ratio is paired,
# and the median of the rounds' ratios keeps one launch's state of the memory system (which moves
# both figures together, by up to 1.5x here) out of the comparison.
ar_ratio = st.median(a / b for a, b in zip(F["ar_busbw"], F["ar_p2p"]))
print(f"# medians of {len(F['ar_busbw'])} rounds")
print(f"| figure | ib_healthcheck | reference | reference tool | ratio | bar | result |")
print(f"|---|---|---|---|---|---|---|")
ok = True
for name, tool, ours, ref, kind in rows:
    ratio = ar_ratio if kind == "ar" else ours / ref
    if kind == "lat": bar, good = "<= 1.10", ratio <= 1.10
    elif kind == "bw": bar, good = ">= 0.90", ratio >= 0.90
    elif kind == "info": bar, good = "-", True
    else: bar, good = ">= 0.80", ratio >= 0.80
    ok = ok and good
    res = "-" if kind == "info" else "PASS" if good else "MISS"
    print(f"| {name} | {ours:.3f} | {ref:.3f} | {tool} | {ratio:.3f} | {bar} | {res} |")
print("# Result:", "OK" if ok else "FAILED (a bar was missed)")
raise SystemExit(0 if ok else 1)
PY
