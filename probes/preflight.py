"""Before a GPU round (CPU, seconds): which shipped tuned entries and which families' validation
records are not current for the sources in this checkout, and whether the round's tunes can
export.

    python probes/preflight.py ["KERNEL:SHAPE[:TEMPLATE] ..."]     (the round's $TUNE_TASKS)

`export` drops every entry of a kernel that is not current at each of its tuned shapes, so a
tune at one shape after a kernel edit, with the kernel's other entries not yet carried over by
`identity` and `restamp`, empties that kernel from the table. Exit status 1 names such a tune.
"""
from __future__ import annotations

import json
import sys

from pycuda_heads.catalog import catalog
from pycuda_heads.core.op import op_source_hash
from pycuda_heads.core.tuned import TABLE_DIR
from pycuda_heads.records import read_json
from pycuda_heads.verify.validation import stale_families

REPORTS = TABLE_DIR.parents[1] / "reports"


def shape_key(shape: str) -> str:
    """`B=65536` or `B=1024,K=128` as a sorted JSON object, the table's shape field's form."""
    return json.dumps({k: int(v) for k, v in (kv.split("=") for kv in shape.split(","))},
                      sort_keys=True)


def main(tasks: list[str]) -> int:
    cat = catalog()
    tuned_at = {}  # kernel -> shapes the round tunes
    for task in tasks:
        kernel, shape, *_ = task.split(":")
        tuned_at.setdefault(kernel, set()).add(shape_key(shape))
    bad = 0
    for path in sorted(TABLE_DIR.glob("*.json")):
        stale = {}
        for e in json.loads(path.read_text())["entries"]:
            if e.get("source_hash") != op_source_hash(cat[e["kernel"]].op):
                stale.setdefault(e["kernel"], []).append(json.dumps(e["shape"], sort_keys=True))
        for kernel, shapes in sorted(stale.items()):
            left = [s for s in shapes if s not in tuned_at.get(kernel, ())]
            doomed = kernel in tuned_at and left
            bad += bool(doomed)
            print(f"{path.stem}: {kernel}: stale at {', '.join(shapes)}"
                  + (f"; the round's tune would export none of its entries (still stale: "
                     f"{', '.join(left)}): run identity and restamp first" if doomed else ""))
    for rec in sorted(REPORTS.glob("*/validation.json")):
        for family, why in sorted(stale_families(read_json(rec), cat).items()):
            print(f"{rec.parent.name}: validation of {family}: {why}")
    print("preflight:", "a tune would empty a kernel" if bad else "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(" ".join(sys.argv[1:]).split()))
