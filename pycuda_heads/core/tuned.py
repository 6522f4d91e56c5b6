"""Run-time lookup of tuned launch parameters from the tables shipped in ``pycuda_heads/tuned/``.

A table is one JSON file per GPU (``<gpu-slug>.json``) written by ``pycuda-heads export``:

    {"gpu": "NVIDIA H200", "slug": "nvidia-h200", "provenance": {...},
     "entries": [{"kernel": "pool.forward", "template": {"N_HORIZONS": 5, "HIDDEN_DIM": 128},
                  "shape": {"B": 4096, "K": 256}, "params": {"BLOCK": 256, ...},
                  "time_us": 123.4, "default_time_us": 150.0, "validated": true}, ...]}

An entry applies when kernel and template constants match exactly; among those the nearest
shape wins (smallest sum of |log(a/b)| over the shape's axes). The environment variable
PYCUDA_HEADS_TUNED_DIR points at another folder of tables.
"""
from __future__ import annotations

import json
import math
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

TABLE_DIR = Path(__file__).resolve().parent.parent / "tuned"


def table_dir() -> Path:
    return Path(os.environ.get("PYCUDA_HEADS_TUNED_DIR") or TABLE_DIR)


@lru_cache(maxsize=None)
def _load(path: str, mtime: float) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def load_table(slug: str) -> dict[str, Any] | None:
    path = table_dir() / f"{slug}.json"
    if not path.is_file():
        return None
    return _load(str(path), path.stat().st_mtime)


def shape_distance(a: Mapping[str, int], b: Mapping[str, int]) -> float:
    if set(a) != set(b):
        return math.inf
    return sum(abs(math.log(max(a[k], 1) / max(b[k], 1))) for k in a)


def lookup(kernel: str, template: Mapping[str, int], shape: Mapping[str, int],
           slug: str) -> tuple[dict[str, Any] | None, str]:
    """(params, where they came from); params is None when no validated entry applies."""
    table = load_table(slug)
    if table is None:
        return None, f"default (no tuned table for {slug})"
    template = {k: int(v) for k, v in template.items()}
    best, best_d = None, math.inf
    for entry in table.get("entries", ()):
        if entry["kernel"] != kernel or entry["template"] != template or not entry.get("validated"):
            continue
        d = shape_distance(entry["shape"], shape)
        if d < best_d:
            best, best_d = entry, d
    if best is None:
        return None, f"default (no tuned {kernel} for {template} on {slug})"
    tuned_shape = ",".join(f"{k}={v}" for k, v in best["shape"].items())
    return dict(best["params"]), f"tuned {slug} {kernel} at {tuned_shape}"
