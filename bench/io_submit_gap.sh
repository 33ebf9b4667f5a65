#!/usr/bin/env bash
# Where a queue-depth-1 stream loses time: traces io_submit entries and io_getevents exits (kernel
# tracepoints, perf record) while COMMAND runs, and prints, per thread that does both, the median
# and p90 of (a) the gap from one io_getevents return to the next io_submit (user-space time between
# requests: the engine's own overhead) and (b) io_submit to io_getevents return (time in the kernel
# and device); and, at any queue depth, how many completions each io_getevents returned and how
# many requests each io_submit carried: a return of the whole queue depth means every request
# finished before the thread reaped, so the device sat idle until the next submission. Run it on
# nvme_bench and on fio with the same case (libaio engine).
#
#   bench/io_submit_gap.sh COMMAND...
#   e.g. bench/io_submit_gap.sh build/apps/nvme_bench/nvme_bench --path /tmp/g --size 512M --block-size 1M --queue-depth 1 --engine libaio
#        bench/io_submit_gap.sh fio --name=g --filename=/tmp/g/f --ioengine=libaio --direct=1 --rw=write --bs=1M --iodepth=1 --size=512M --end_fsync=1
#
# Needs perf with access to the syscalls tracepoints (root, or kernel.perf_event_paranoid <= -1).
set -euo pipefail
[[ $# -ge 1 ]] || { sed -n 2,12p "$0" >&2; exit 2; }
command -v perf >/dev/null || { echo "perf not found: run scripts/install_deps.sh --bench" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
perf record -q -e syscalls:sys_enter_io_submit,syscalls:sys_exit_io_getevents -o "$tmp/perf.data" -- "$@" >"$tmp/out" 2>&1 ||
  { cat "$tmp/out" >&2; exit 1; }
grep -E 'MB/s|bw=' "$tmp/out" | head -3 || true
perf script -i "$tmp/perf.data" -F comm,tid,cpu,time,event,trace 2>/dev/null >"$tmp/trace"
python3 - "$tmp/trace" <<'PY'
import collections, re, statistics, sys
events = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r"\s*(\S+)\s+(\d+)\s+\[\d+\]\s+([\d.]+):\s+(\S+):(.*)", line)
    if m:
        # io_submit's nr (requests carried), io_getevents' return value (completions reaped)
        n = re.search(r"nr: (0x[0-9a-f]+)", m.group(5)) or re.search(r"^\s*(0x[0-9a-f]+)", m.group(5))
        events[m.group(2)].append((float(m.group(3)), m.group(4), int(n.group(1), 16) if n else 0))
shown = 0
for tid, evs in events.items():
    gaps, inflight, last_exit, last_submit = [], [], None, None
    carried, reaped = collections.Counter(), collections.Counter()
    for t, e, n in evs:
        if e.endswith("sys_enter_io_submit"):
            if last_exit is not None:
                gaps.append((t - last_exit) * 1e6)
            last_submit = t
            carried[n] += 1
        elif e.endswith("sys_exit_io_getevents"):
            last_exit = t
            if last_submit is not None:
                inflight.append((t - last_submit) * 1e6)
            reaped[n] += 1
    if len(gaps) < 20:
        continue
    p90 = lambda v: sorted(v)[int(0.9 * (len(v) - 1))]
    print(f"thread {tid}: {len(gaps)} requests; getevents return -> next submit: median {statistics.median(gaps):.1f} us, "
          f"p90 {p90(gaps):.1f} us; submit -> getevents return: median {statistics.median(inflight):.1f} us")
    hist = lambda c: ", ".join(f"{k}: {v}" for k, v in sorted(c.items()))
    print(f"  io_submit calls by requests carried {{{hist(carried)}}}; io_getevents returns by completions {{{hist(reaped)}}}")
    shown += 1
if not shown:
    sys.exit("no thread issued 20+ io_submit/io_getevents pairs (is the engine libaio?)")
PY
