#!/usr/bin/env python3
"""Fails if a lib/ layer includes a header of a higher layer (docs/architecture.md), or if core
includes MPI or CUDA headers. Usage: check_layering.py REPO_ROOT"""
import pathlib
import re
import sys

ORDER = ["core", "comm", "io", "kernels", "model", "parallel", "engine"]
# kernels sits above io in the product's layering but does not need it; allowed includes are
# every layer strictly below.
root = pathlib.Path(sys.argv[1])
bad = []
inc = re.compile(r'#\s*include\s*[<"]hpct/(\w+)/')
for layer in ORDER:
    d = root / "lib" / layer
    if not d.exists():
        continue
    allowed = set(ORDER[: ORDER.index(layer) + 1])
    for f in sorted(d.rglob("*")):
        if f.suffix not in (".hpp", ".cpp", ".cu", ".cuh", ".h"):
            continue
        text = f.read_text(errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            m = inc.search(line)
            if m and m.group(1) not in allowed:
                bad.append(f"{f.relative_to(root)}:{n}: layer '{layer}' includes hpct/{m.group(1)}/ (a higher layer)")
            if layer == "core" and re.search(r'#\s*include\s*[<"](mpi\.h|cuda|nccl)', line):
                bad.append(f"{f.relative_to(root)}:{n}: core must not include MPI/CUDA/NCCL headers")
for b in bad:
    print(b)
print(f"{len(bad)} layering violations")
sys.exit(1 if bad else 0)
