"""Before a GPU round (CPU, seconds): what `export` would make of this checkout's tuning caches
and shipped table, which families' validation records are stale, and whether the round's tunes
can export.

    python probes/preflight.py ["KERNEL:SHAPE[:TEMPLATE] ..."]     (the round's $TUNE_TASKS)

`export` ships a kernel only with a current entry at every suite shape, so a tune at one shape
after a kernel edit, with the kernel's other entries not yet carried over by `identity` and
`restamp`, empties that kernel from the table. Exit status 1 names such a tune. Where a tune
is to make the only current entry, a budget that stops it before its comparison with the
default ships the default (3bd193d's round lost both B=65536 entries of FrdHead's backward so).
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from pycuda_heads.catalog import catalog
from pycuda_heads.core.tuned import TABLE_DIR
from pycuda_heads.records import read_json
from pycuda_heads.tuning.export import build_table, suite_shapes
from pycuda_heads.verify.validation import stale_families

REPORTS = Path("reports")


def shape_key(shape: dict | str) -> str:
    """A shape (a dict, or `B=1024,K=128`) as sorted JSON."""
    if isinstance(shape, str):
        shape = {k: int(v) for k, v in (kv.split("=") for kv in shape.split(","))}
    return json.dumps(shape, sort_keys=True)


def main(tasks: list[str]) -> int:
    logging.getLogger("pycuda_heads.tuning").setLevel(logging.ERROR)  # the summary says it
    tuned_at: dict[str, set[str]] = {}
    for task in tasks:
        kernel, shape, *_ = task.split(":")
        tuned_at.setdefault(kernel, set()).add(shape_key(shape))
    bad = 0
    for path in sorted(TABLE_DIR.glob("*.json")):
        shipped = json.loads(path.read_text())["entries"]
        built = build_table(REPORTS, path.stem, shipped=shipped)
        incomplete = built["provenance"]["kernels_not_tuned_at_every_suite_shape"]
        exported = {e["kernel"] for e in built["entries"]}
        for kernel in sorted({e["kernel"] for e in shipped} | set(tuned_at)):
            lacking = incomplete.get(kernel, [] if kernel in exported else suite_shapes(kernel))
            if not lacking:
                continue
            left = sorted({shape_key(s) for s in lacking} - tuned_at.get(kernel, set()))
            doomed = kernel in tuned_at and left
            bad += bool(doomed)
            advice = ""
            if doomed:
                advice = (f"; after the round's tunes still none at {', '.join(left)}: run "
                          "identity and restamp first")
            elif kernel in tuned_at:
                advice = ("; the round's tune must finish its trials and the comparison with "
                          "the default within its budget, else the default ships there")
            print(f"{path.stem}: {kernel}: export would drop it, no current entry at "
                  f"{', '.join(shape_key(s) for s in lacking)}{advice}")
    for rec in sorted(REPORTS.glob("*/validation.json")):
        for family, why in sorted(stale_families(read_json(rec), catalog()).items()):
            print(f"{rec.parent.name}: validation of {family}: {why}")
    print("preflight:", "a tune would empty a kernel" if bad else "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(" ".join(sys.argv[1:]).split()))
