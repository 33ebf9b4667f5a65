#!/usr/bin/env bash
# The host AdamW step over GPT-2 124M's 124,439,808 parameters: hpctrain's kernels::adamw_runs
# (bench/host_adam.cpp) against torch.optim.AdamW (fp32, foreach=False and True), at each thread
# count, the programs alternated ROUNDS times in one run. Prints a table of medians.
#   bench/host_adam.sh [THREADS="1 2"] [ROUNDS=3]      (needs ./build and python3-torch: install_deps.sh --bench)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
threads=${1:-"1 2"} rounds=${2:-3} py=${PYTHON:-/usr/bin/python3}  # Debian's python3-torch
exe=${TMPDIR:-/tmp}/hpct_host_adam
kokkos=$(find /usr/lib /usr/lib64 -name 'lib*kokkoscore.so' 2>/dev/null | head -1)  # Debian: libtrilinos_kokkoscore
c++ -O3 -std=c++20 -fopenmp -I"$root/lib/kernels/include" -I"$root/lib/core/include" "$root/bench/host_adam.cpp" \
  "$root/build/lib/kernels/libhpct_kernels.a" "$root/build/lib/core/libhpct_core.a" "$kokkos" -lopenblas -ldnnl -ldl \
  -o "$exe"
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; git $(git -C "$root" rev-parse --short HEAD)"
out=$(mktemp)
for _ in $(seq "$rounds"); do
  for t in $threads; do
    "$exe" "$t" >>"$out"
    for fe in False True; do
      "$py" - "$t" "$fe" >>"$out" <<'PY'
import json, sys, time, torch
t, fe = int(sys.argv[1]), sys.argv[2] == "True"
torch.set_num_threads(t)
P = 124439808
ps = [torch.nn.Parameter(torch.full((min(1 << 20, P - lo),), 0.01)) for lo in range(0, P, 1 << 20)]
for p in ps:
    p.grad = torch.linspace(-1, 1, p.numel())
opt = torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.1, foreach=fe)
ts = []
for s in range(8):
    t0 = time.perf_counter(); opt.step(); dt = time.perf_counter() - t0
    if s: ts.append(dt)
print(json.dumps({"program": f"torch {torch.__version__} AdamW (foreach={fe})", "grad": "fp32", "threads": t,
                  "params": P, "step_seconds": sorted(ts)[len(ts) // 2]}))
PY
    done
  done
done
"$py" - "$out" <<'PY'
import json, statistics, sys, collections
rows = collections.defaultdict(list)
for l in open(sys.argv[1]):
    j = json.loads(l)
    rows[(j["threads"], j["program"] + (" " + j["isa"] if "isa" in j else ""), j["grad"])].append(j["step_seconds"])
print(f"{'threads':>7}  {'program':<44} {'gradient':<18} {'step (s)':>9} {'GB/s':>7}")
for (t, prog, grad), v in sorted(rows.items()):
    s = statistics.median(v)
    # bytes moved: p, m, v read and written, the gradient read (bf16: 2 bytes, and the 2-byte copy written)
    traffic = 124439808 * ((4 + 4 + 4) * 2 + (4 if grad == "fp32" else 2 + 2))
    print(f"{t:>7}  {prog:<44} {grad:<18} {s:9.3f} {traffic / s / 1e9:7.1f}")
PY
rm -f "$out"
