#!/usr/bin/env bash
# Checkpoint save and load bandwidth next to fio's sequential write and read on the same disk, in
# the same run, alternated ROUNDS times; medians compared. The bar (checkpoint issue): >= 80% of fio.
#
#   bench/ckpt_vs_fio.sh [DIR] [ROUNDS]          e.g. bench/ckpt_vs_fio.sh /tmp/ckbench 3
#
# Checkpoint: GPT-2 medium shape (24 layers, hidden 1024, vocab 50257: 355 M parameters; fp32
# weights + Adam m and v = 4.26 GB in one HDF5 file), 2 ranks at ZeRO stage 3, each writing and
# reading its own slices through parallel HDF5 (MPI-IO); the save's clock includes the fsync, the
# rename and `latest`; the load's includes the checksum check of every tensor. fio: 2 jobs, each
# half the checkpoint's bytes, bs 1M, iodepth 8, libaio, O_DIRECT, end_fsync for writes. Page
# cache is dropped before each read (root only; without root the reads may come from memory and the
# script says so). Then --async-save: the training stall of a background save against the
# synchronous save of the same state (bar: <= 10%). Needs fio (scripts/install_deps.sh --bench)
# and a build in ./build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/build/ckpt_bench_scratch}
rounds=${2:-3}
bin="$root/build/apps/pretrain_gpt/pretrain_gpt"
command -v fio >/dev/null || { echo "fio not found: run scripts/install_deps.sh --bench" >&2; exit 1; }
[[ -x "$bin" ]] || { echo "$bin not built" >&2; exit 1; }
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$dir/ckpt" "$dir"/fio_ckpt.*' EXIT
mpi=(mpirun --oversubscribe -np 2)
[[ $(id -u) == 0 ]] && mpi+=(--allow-run-as-root)
drop() {
  sync
  if [[ -w /proc/sys/vm/drop_caches ]]; then echo 1 >/proc/sys/vm/drop_caches; else echo "# (not root: page cache not dropped)"; fi
}
median() { python3 -c 'import sys,statistics; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }
model=(--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 128 --micro-batch-size 1
  --global-batch-size 2 --mock-data --vocab-size 50257 --lr 1e-4 --eval-iters 0 --log-interval 1 --zero-stage 3)

ck_save=() ck_load=() fio_w=() fio_r=()
for ((r = 1; r <= rounds; r++)); do
  # ---- checkpoint: one step, save at its end; then a second job loads it ----
  rm -rf "$dir/ckpt"
  "${mpi[@]}" "$bin" "${model[@]}" --train-iters 1 --save "$dir/ckpt" >"$tmp/save.log" 2>&1 || { cat "$tmp/save.log"; exit 1; }
  bytes=$(stat -c %s "$dir"/ckpt/iter_*.h5)
  s=$(sed -n 's/.*successfully saved checkpoint.* in \([0-9.]*\) s,.*/\1/p' "$tmp/save.log")
  drop
  "${mpi[@]}" "$bin" "${model[@]}" --train-iters 1 --load "$dir/ckpt" >"$tmp/load.log" 2>&1 || { cat "$tmp/load.log"; exit 1; }
  l=$(sed -n 's/.*successfully loaded checkpoint.* in \([0-9.]*\) s,.*/\1/p' "$tmp/load.log")
  ck_save+=("$(python3 -c "print($bytes / $s / 1e6)")")
  ck_load+=("$(python3 -c "print($bytes / $l / 1e6)")")
  rm -rf "$dir/ckpt"
  # ---- fio: the same bytes, 2 jobs ----
  half=$((bytes / 2 / 1048576 * 1048576))
  rm -f "$dir"/fio_ckpt.*
  # shellcheck disable=SC2016  # $jobnum is fio's, not the shell's
  fio --name=ckpt --directory="$dir" --filename_format='fio_ckpt.$jobnum' --ioengine=libaio --direct=1 --rw=write \
    --bs=1M --iodepth=8 --numjobs=2 --size="$half" --end_fsync=1 --group_reporting --output-format=json >"$tmp/fw.json"
  drop
  # shellcheck disable=SC2016
  fio --name=ckpt --directory="$dir" --filename_format='fio_ckpt.$jobnum' --ioengine=libaio --direct=1 --rw=read \
    --bs=1M --iodepth=8 --numjobs=2 --size="$half" --group_reporting --output-format=json >"$tmp/fr.json"
  fio_w+=("$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"][0]["write"]["bw_bytes"]/1e6)' "$tmp/fw.json")")
  fio_r+=("$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"][0]["read"]["bw_bytes"]/1e6)' "$tmp/fr.json")")
  rm -f "$dir"/fio_ckpt.*
  printf "# round %d/%d: checkpoint %.2f GB: save %.0f MB/s, load %.0f MB/s | fio write %.0f MB/s, read %.0f MB/s\n" \
    "$r" "$rounds" "$(python3 -c "print($bytes/1e9)")" "${ck_save[-1]}" "${ck_load[-1]}" "${fio_w[-1]}" "${fio_r[-1]}"
done
# ---- --async-save: the training stall per save vs the synchronous save of the same state ----
# 6 iterations, a save every 2: iterations 2 and 4 are saved in the background (the first also
# allocates the host copy), iteration 6 (the final save) synchronously; the summary records each
# save's stall.
rm -rf "$dir/ckpt"
"${mpi[@]}" "$bin" "${model[@]}" --train-iters 6 --save "$dir/ckpt" --save-interval 2 --async-save \
  --json "$tmp/async.json" >"$tmp/async.log" 2>&1 || { cat "$tmp/async.log"; exit 1; }
grep -E "saving checkpoint|successfully saved" "$tmp/async.log"
# The same run with synchronous saves: what the background writer costs the training around it
# (it shares the rank's core: a stall is not the whole story on a machine without spare cores).
rm -rf "$dir/ckpt"
"${mpi[@]}" "$bin" "${model[@]}" --train-iters 6 --save "$dir/ckpt" --save-interval 2 \
  --json "$tmp/sync.json" >"$tmp/sync.log" 2>&1 || { cat "$tmp/sync.log"; exit 1; }
python3 - "$tmp/async.json" "$tmp/sync.json" "$tmp/async.log" "$tmp/sync.log" <<'EOF2'
import json, re, sys
j = json.load(open(sys.argv[1])); js = json.load(open(sys.argv[2]))
def iter_ms(log):
    return {int(m.group(1)): float(m.group(2)) for m in
            re.finditer(r"iteration +(\d+)/ +\d+ \|.*?elapsed time per iteration \(ms\): ([0-9.]+)", open(log).read())}
ia, isy = iter_ms(sys.argv[3]), iter_ms(sys.argv[4])
# What the background writer costs the iterations it overlaps (3 and 5) on a machine without spare cores.
for i in (3, 5):
    print(f"iteration {i} (overlapping a background save): {ia[i]/1e3:.2f} s with --async-save, {isy[i]/1e3:.2f} s "
          f"without: {(ia[i]-isy[i])/1e3:+.2f} s")
print(f"6 iterations with a save every 2: {j['total_seconds']:.1f} s with --async-save, {js['total_seconds']:.1f} s with "
      f"synchronous saves")
s = j["checkpoint_saves"]
a = [x for x in s if x["async"]]; y = [x for x in s if not x["async"]][0]
for x, what in zip(a, ["first save", "second save"]):
    print(f"--async-save, {what}: training stalled {x['stall_seconds']:.3f} s at iteration {x['iteration']} (written in the "
          f"background in {x['seconds']:.2f} s) vs {y['stall_seconds']:.2f} s for the synchronous save of iteration "
          f"{y['iteration']}: {x['stall_seconds']/y['stall_seconds']:.1%} (bar <= 10%)")
EOF2
rm -rf "$dir/ckpt"

sm=$(median "${ck_save[@]}") lm=$(median "${ck_load[@]}") wm=$(median "${fio_w[@]}") rm_=$(median "${fio_r[@]}")
python3 - "$sm" "$lm" "$wm" "$rm_" <<'EOF'
import sys
s, l, w, r = map(float, sys.argv[1:])
print(f"medians: save {s:.0f} MB/s vs fio write {w:.0f} MB/s = {s/w:.0%}; load {l:.0f} MB/s vs fio read {r:.0f} MB/s = {l/r:.0%} (bar >= 80%)")
EOF
