#!/usr/bin/env bash
# A/B of two nvme_bench builds against fio on one case: the three programs alternate ROUNDS times
# (their order rotating each round) and the script prints each program's median and the median of
# the per-round paired ratios to fio. For judging an engine change on a disk whose speed swings
# 20-40% from run to run (bench/nvme_vs_fio.sh is the full comparison).
#
#   bench/nvme_ab_fio.sh OLD_BIN NEW_BIN [DIR] [ROUNDS] [MODE] [BS] [QD] [SIZE] [ENGINE]
#   e.g. bench/nvme_ab_fio.sh /tmp/old/apps/nvme_bench/nvme_bench build/apps/nvme_bench/nvme_bench /tmp/ab 9 write 1M 1
#
# Same settings as bench/nvme_vs_fio.sh: O_DIRECT, one thread, a fresh preallocated file per write
# with the closing fsync timed (fio --end_fsync=1); a read runs on the file that program has just
# written. Needs fio (scripts/install_deps.sh --bench).
set -euo pipefail
[[ $# -ge 2 ]] || { sed -n 2,12p "$0" >&2; exit 2; }
old=$1 new=$2 dir=${3:-/tmp/nvme_ab} rounds=${4:-9} mode=${5:-write} bs=${6:-1M} qd=${7:-1} size=${8:-1G} eng=${9:-libaio}
for b in "$old" "$new"; do [[ -x $b ]] || { echo "$b: not an executable" >&2; exit 1; }; done
command -v fio >/dev/null || { echo "fio not found: run scripts/install_deps.sh --bench" >&2; exit 1; }
[[ $mode == write || $mode == read ]] || { echo "MODE must be write or read, not '$mode'" >&2; exit 1; }
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; rm -f "$dir"/fio_ab.dat "$dir"/nvme_bench.*' EXIT

run_fio() {
  rm -f "$dir/fio_ab.dat"
  fio --name=ab --filename="$dir/fio_ab.dat" --ioengine="$eng" --direct=1 --rw=write --bs="$bs" --iodepth="$qd" \
    --size="$size" --end_fsync=1 --output-format=json >"$tmp/w.json" 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
  if [[ $mode == read ]]; then
    fio --name=ab --filename="$dir/fio_ab.dat" --ioengine="$eng" --direct=1 --rw=read --bs="$bs" --iodepth="$qd" \
      --size="$size" --output-format=json >"$tmp/r.json" 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"][0]["read"]["bw_bytes"]/1e6)' "$tmp/r.json"
  else
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"][0]["write"]["bw_bytes"]/1e6)' "$tmp/w.json"
  fi
}

run_nb() {  # binary -> MB/s of MODE (a read follows that binary's own write, in its own process)
  rm -f "$dir"/nvme_bench.*
  local modes=write
  [[ $mode == read ]] && modes="write read"
  for m in $modes; do
    "$1" --path "$dir" --size "$size" --mode "$m" --block-size "$bs" --queue-depth "$qd" --threads 1 --engine "$eng" \
      --keep --json "$tmp/nb.json" >"$tmp/nb.log" 2>&1 || { cat "$tmp/nb.log" >&2; exit 1; }
  done
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["cases"][0]["bandwidth_MBps"])' "$tmp/nb.json"
}

echo "# nvme_bench A/B vs $(fio --version): $mode bs=$bs qd=$qd size=$size $eng, O_DIRECT, $rounds rounds, $(date -u +%F)"
echo "# A = $old"
echo "# B = $new"
A=() B=() F=()
for ((i = 0; i < rounds; i++)); do
  case $((i % 3)) in
    0) a=$(run_nb "$old"); b=$(run_nb "$new"); f=$(run_fio) ;;
    1) b=$(run_nb "$new"); f=$(run_fio); a=$(run_nb "$old") ;;
    2) f=$(run_fio); a=$(run_nb "$old"); b=$(run_nb "$new") ;;
  esac
  A+=("$a") B+=("$b") F+=("$f")
  printf "  round %d/%d: A %.0f  B %.0f  fio %.0f MB/s\n" $((i + 1)) "$rounds" "$a" "$b" "$f"
done
python3 - "${A[*]}" "${B[*]}" "${F[*]}" <<'PY'
import statistics as st, sys
a, b, f = ([float(x) for x in s.split()] for s in sys.argv[1:4])
m = st.median
print(f"medians MB/s: A {m(a):.1f}  B {m(b):.1f}  fio {m(f):.1f}")
print(f"A/fio: ratio of medians {m(a)/m(f):.3f}, median of paired ratios {m([x/y for x, y in zip(a, f)]):.3f}")
print(f"B/fio: ratio of medians {m(b)/m(f):.3f}, median of paired ratios {m([x/y for x, y in zip(b, f)]):.3f}")
PY
