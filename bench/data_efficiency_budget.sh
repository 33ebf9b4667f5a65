#!/usr/bin/env bash
# Curriculum + random-LTD on a smaller budget, as DeepSpeed measures data efficiency: the
# composition trains for SHORT iterations (its LR decay, curriculum and random-LTD schedules all
# scaled to that budget) and is held against the baseline's final validation loss after FULL
# iterations. The baseline on the same SHORT budget is the control: if it reaches that loss too,
# the saving is the shorter schedule's, not the method's. Per seed, the three runs alternate
# (baseline FULL, curriculum + random-LTD SHORT, baseline SHORT) so their wall-clocks share the
# machine's state. Each run is bench/data_efficiency_brown.sh's (gpt-tiny on Brown, 2 ranks).
#
#   bench/data_efficiency_budget.sh [FULL] [SHORT] [OUT_DIR]   defaults: 300, 230,
#                                                              bench/out/data_efficiency_budget
#   SEEDS="1234 42 7 99" (default) picks the seeds.
# Needs a build in ./build and the data of scripts/fetch_data.sh in ./data.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
full=${1:-300}
short=${2:-230}
out=${3:-$root/bench/out/data_efficiency_budget}
seeds=${SEEDS:-1234 42 7 99}
for s in $seeds; do
  SEED=$s RUNS=baseline "$root/bench/data_efficiency_brown.sh" "$full" "$out/seed$s/full" > /dev/null
  SEED=$s RUNS="voc+ltd baseline" "$root/bench/data_efficiency_brown.sh" "$short" "$out/seed$s/short" > /dev/null
done
python3 - "$out" "$full" "$short" $seeds <<'PY'
import json, statistics, sys
out, full, short, seeds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
def run(path):
    recs = [json.loads(l) for l in open(path + ".jsonl")]
    t0 = min(r["wall_time"] for r in recs if "wall_time" in r)
    ev = [r for r in recs if r.get("type") == "eval"]
    return ev[-1]["val_loss"], ev[-1]["wall_time"] - t0, json.load(open(path + ".json"))["consumed_tokens"]
print(f"| seed | baseline {full} it: final val loss, wall-clock | CL + LTD {short} it: final, wall-clock, "
      f"less wall-clock | baseline {short} it: final, wall-clock | CL + LTD reaches the target | baseline {short} does |")
print("|---|---|---|---|---|---|")
ratios = []
for s in seeds:
    bl, bt, btok = run(f"{out}/seed{s}/full/baseline")
    cl, ct, ctok = run(f"{out}/seed{s}/short/voc_ltd")
    sl, st, stok = run(f"{out}/seed{s}/short/baseline")
    ratios.append(bt / ct)
    print(f"| {s} | {bl:.4f}, {bt:.0f} s | {cl:.4f}, {ct:.0f} s, {bt / ct:.2f}x ({btok / ctok:.2f}x fewer tokens) | "
          f"{sl:.4f}, {st:.0f} s | {'yes' if cl <= bl else 'no'} | {'yes' if sl <= bl else 'no'} |")
print(f"median wall-clock ratio {statistics.median(ratios):.2f}x over {len(seeds)} seeds")
PY
