#!/usr/bin/env bash
# nvme_bench vs fio on the same disk, file size, block size, queue depth, threads and engine,
# side by side, sequential write and read, O_DIRECT (DeepNVMe's blog used fio as its reference).
#
#   bench/nvme_vs_fio.sh [DIR] [ROUNDS] [SIZE] [ENGINES]     e.g. bench/nvme_vs_fio.sh /tmp 5 2G "libaio io_uring"
#   (ROUNDS 0 runs only the --tune comparison; TUNE_LOOPS=N sets its passes, default 3)
#
# Cases: (bs 1M, QD 1/8/32) and (bs 128K / 8M, QD 8), one thread. The programs alternate ROUNDS
# times (this machine's timings swing 20-40% run to run) and the medians are compared; the bar is
# every ratio within +-5%. A control runs beside them: fio a second time ("fio'"), in the same
# rotation, compared with the first fio the same way. Where fio' / fio also falls outside +-5%,
# the disk's swing is larger than the bar at this many rounds and the pair cannot judge it. Then `nvme_bench --tune` runs its sweep over bs {128K,1M,8M} x
# QD {1,8,32} and fio runs the same grid, both taking medians over TUNE_LOOPS passes (default 3);
# the bar is the tuned pick within 10% of fio's best.
# fio: --direct=1 --end_fsync=1 (writes), numjobs = threads with one region each; nvme_bench
# fdatasyncs before a write case's clock stops too. Each program writes a fresh, preallocated file
# in one process and reads it back in the next (nvme_bench --keep), so both see the same gaps
# between a write and the read after it (this VM's disk caches recent writes on the host). Needs `scripts/install_deps.sh --bench` (fio)
# and a build in ./build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/build/nvme_bench_scratch}
rounds=${2:-5}
size=${3:-2G}
engines=${4:-"libaio io_uring"}
nb="$root/build/apps/nvme_bench/nvme_bench"
command -v fio >/dev/null || { echo "fio not found: run scripts/install_deps.sh --bench" >&2; exit 1; }
[[ -x "$nb" ]] || { echo "$nb not built" >&2; exit 1; }
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; rm -f "$dir"/fio_bench.* "$dir"/nvme_bench.*' EXIT

bytes() { python3 -c 'import sys; s=sys.argv[1]; m={"K":2**10,"M":2**20,"G":2**30}; print(int(float(s[:-1])*m[s[-1]]) if s[-1] in m else int(s))' "$1"; }
median() { python3 -c 'import sys,statistics; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }
size_b=$(bytes "$size")

run_fio() {  # engine rw bs qd threads -> MB/s
  local eng=$1 rw=$2 bs=$3 qd=$4 t=$5 extra=()
  # Writes start from a fresh file, as nvme_bench's do (it deletes its file after each run): an
  # overwrite of blocks already written lands in this VM's host cache at several GB/s.
  if [[ $rw == write ]]; then extra+=(--end_fsync=1); rm -f "$dir/fio_bench.dat"; fi
  fio --name=nvme_vs_fio --filename="$dir/fio_bench.dat" --ioengine="$eng" --direct=1 --rw="$rw" --bs="$bs" \
    --iodepth="$qd" --numjobs="$t" --size=$((size_b / t)) --offset_increment=$((size_b / t)) --thread \
    --group_reporting --output-format=json "${extra[@]}" >"$tmp/fio.json" 2>"$tmp/fio.err" || { cat "$tmp/fio.err" >&2; exit 1; }
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(j[sys.argv[2]]["bw_bytes"]/1e6)' "$tmp/fio.json" "$rw"
}

run_nb() {  # engine rw bs qd threads -> MB/s; one process per mode, as fio runs them
  local eng=$1 rw=$2 bs=$3 qd=$4 t=$5
  [[ $rw == write ]] && rm -f "$dir"/nvme_bench.*
  "$nb" --path "$dir" --size "$size" --mode "$rw" --block-size "$bs" --queue-depth "$qd" --threads "$t" \
    --engine "$eng" --keep --json "$tmp/nb.json" >"$tmp/nb.log" 2>&1 || { cat "$tmp/nb.log" >&2; exit 1; }
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["cases"][0]["bandwidth_MBps"])' "$tmp/nb.json"
}

echo "# nvme_bench vs $(fio --version) on $dir ($(df -hT "$dir" | awk 'NR==2{print $2, $1}')), $(nproc) cores, $(date -u +%F)"
echo "# git $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown); file $size; O_DIRECT; rounds $rounds (medians); 1 thread"
[[ $rounds -gt 0 ]] && printf "%-9s %-6s %6s %4s %14s %14s %7s %14s %7s\n" engine rw bs qd nvme_MB/s fio_MB/s ratio "fio'_MB/s" "fio'/fio"
cases=("1M 1" "1M 8" "1M 32" "128K 8" "8M 8")
fails=0; ctl_fails=0
[[ $rounds -gt 0 ]] || cases=()  # ROUNDS 0: only the --tune comparison
for eng in $engines; do
  for c in "${cases[@]}"; do
    read -r bs qd <<<"$c"
    nw=(); nr=(); fw=(); fr=(); gw=(); gr=()
    for ((i = 1; i <= rounds; i++)); do
      # write then read for each program; the order of the three rotates by round
      for ((k = 0; k < 3; k++)); do
        case $(((i + k) % 3)) in
          0) nw+=("$(run_nb "$eng" write "$bs" "$qd" 1)"); nr+=("$(run_nb "$eng" read "$bs" "$qd" 1)") ;;
          1) fw+=("$(run_fio "$eng" write "$bs" "$qd" 1)"); fr+=("$(run_fio "$eng" read "$bs" "$qd" 1)") ;;
          2) gw+=("$(run_fio "$eng" write "$bs" "$qd" 1)"); gr+=("$(run_fio "$eng" read "$bs" "$qd" 1)") ;;
        esac
      done
      printf "  round %d/%d %s bs=%s qd=%s: write %.0f vs %.0f (fio' %.0f), read %.0f vs %.0f (fio' %.0f) MB/s\n" \
        "$i" "$rounds" "$eng" "$bs" "$qd" "${nw[-1]}" "${fw[-1]}" "${gw[-1]}" "${nr[-1]}" "${fr[-1]}" "${gr[-1]}" >&2
    done
    for rw in write read; do
      if [[ $rw == write ]]; then N=$(median "${nw[@]}"); F=$(median "${fw[@]}"); G=$(median "${gw[@]}")
      else N=$(median "${nr[@]}"); F=$(median "${fr[@]}"); G=$(median "${gr[@]}"); fi
      line=$(python3 -c 'import sys; n,f,g=map(float,sys.argv[5:8]); r=n/f; a=g/f; print(f"{sys.argv[1]:<9} {sys.argv[2]:<6} {sys.argv[3]:>6} {sys.argv[4]:>4} {n:14.1f} {f:14.1f} {r:7.3f} {g:14.1f} {a:7.3f}" + ("" if abs(r-1)<=0.05 else "  outside +-5%") + ("" if abs(a-1)<=0.05 else "  control beyond +-5%"))' "$eng" "$rw" "$bs" "$qd" "$N" "$F" "$G")
      echo "$line"
      [[ $line == *"outside +-5%"* ]] && fails=$((fails + 1))
      [[ $line == *"control beyond"* ]] && ctl_fails=$((ctl_fails + 1))
    done
  done
done

# --tune against fio over the same grid (first engine). nvme_bench --tune takes each case's median
# over TUNE_LOOPS passes over its grid (its default is 3); fio runs as many passes over the same
# grid, and its medians are compared the same way: the tuned pick's own figure against fio's best.
# The control: fio runs a second set of passes (fio', alternating with the first), picks its best
# configuration the way --tune does, and its figure there is compared with fio's best just the
# same. Where fio' misses 10% too, the disk's swing decides the comparison, not the pick. (fio and
# fio' share one stretch of time and nvme_bench runs before them, so the control shows the swing
# from pass to pass, not a drift between the two windows.)
eng=${engines%% *}
tl=${TUNE_LOOPS:-3}
echo "# tune: nvme_bench --tune --loops $tl vs fio and fio' ($tl passes each, medians) over bs {128K,1M,8M} x qd {1,8,32}, $eng, 1 thread"
"$nb" --path "$dir" --size "$size" --tune --loops "$tl" --block-size 128K,1M,8M --queue-depth 1,8,32 --threads 1 --engine "$eng" \
  --tune-output "$tmp/aio.json" --json "$tmp/tune.json" >"$tmp/tune.log" 2>&1 || { cat "$tmp/tune.log" >&2; exit 1; }
grep "Best performance" "$tmp/tune.log"
: >"$tmp/fio_grid.txt"
for ((p = 1; p <= 2 * tl; p++)); do
  set_name=$([[ $((p % 2)) == 1 ]] && echo fio || echo "fio'")
  for bs in 128K 1M 8M; do
    for qd in 1 8 32; do
      w=$(run_fio "$eng" write "$bs" "$qd" 1); r=$(run_fio "$eng" read "$bs" "$qd" 1)
      echo "  $set_name pass $(((p + 1) / 2))/$tl $eng bs=$bs qd=$qd: write $w read $r MB/s" >&2
      echo "$set_name $bs $qd $w $r" >>"$tmp/fio_grid.txt"
    done
  done
done
tune_rc=0
python3 - "$tmp/tune.json" "$tmp/fio_grid.txt" <<'PY' || tune_rc=$?
import json, statistics, sys
doc = json.load(open(sys.argv[1]))
d = doc["tune"]
k = {"128K": 128 << 10, "1M": 1 << 20, "8M": 8 << 20}
runs = {"fio": {}, "fio'": {}}
for line in open(sys.argv[2]):
    who, bs, qd, w, r = line.split()
    runs[who].setdefault((k[bs], int(qd)), []).append((float(w), float(r)))
med = {who: {c: (statistics.median(w for w, _ in v), statistics.median(r for _, r in v)) for c, v in g.items()}
       for who, g in runs.items()}
nb = {}
for c in doc["cases"]:
    nb.setdefault((c["aio"]["block_size"], c["aio"]["queue_depth"]), {})[c["mode"]] = c
f, fp = med["fio"], med["fio'"]
print("  medians, MB/s:  config        nvme_bench write  read (loops)          fio write  read   fio' write  read")
for cfg in sorted(med["fio"]):
    w, r = nb[cfg]["write"], nb[cfg]["read"]
    loops = "/".join(f"{x:.0f}" for x in r["loops_MBps"])
    print(f"  bs={cfg[0] >> 10:>5}K qd={cfg[1]:<2}  {w['bandwidth_MBps']:16.0f} {r['bandwidth_MBps']:5.0f} ({loops:>14})"
          f"  {f[cfg][0]:9.0f} {f[cfg][1]:5.0f} {fp[cfg][0]:10.0f} {fp[cfg][1]:5.0f}")
best = max(f, key=lambda c: sum(f[c]))
fs = sum(f[best])
c = d["config"]
ts = d["read_MBps"] + d["write_MBps"]
ctl = max(fp, key=lambda c: sum(fp[c]))
print(f"tuned pick bs={c['block_size']} qd={c['queue_depth']}: write {d['write_MBps']:.1f} + read {d['read_MBps']:.1f} = {ts:.1f} MB/s")
print(f"fio best in the grid bs={best[0]} qd={best[1]}: write {f[best][0]:.1f} + read {f[best][1]:.1f} = {fs:.1f} MB/s")
print(f"control: fio' picks bs={ctl[0]} qd={ctl[1]}, where fio' has {sum(fp[ctl]):.1f} MB/s: {sum(fp[ctl]) / fs:.3f} of fio's best"
      + ("" if abs(sum(fp[ctl]) / fs - 1) <= 0.1 else "  control beyond +-10%: the disk swings more than the bar"))
r = ts / fs
print(f"ratio {r:.3f}" + ("" if r >= 0.9 else "  more than 10% below fio's best"))
sys.exit(0 if r >= 0.9 else 3)
PY
echo "# $fails pair(s) outside +-5% (the control fio' / fio: $ctl_fails); tune $([[ $tune_rc == 0 ]] && echo within || echo NOT within) 10% of fio's best"
