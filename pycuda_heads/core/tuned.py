"""Run-time lookup of tuned launch parameters from the tables shipped in ``pycuda_heads/tuned/``.

A table is one JSON file per GPU (``<gpu-slug>.json``) written by ``pycuda-heads export``:

    {"gpu": "NVIDIA H200", "slug": "nvidia-h200", "provenance": {...},
     "entries": [{"kernel": "pool.forward", "template": {"N_HORIZONS": 5, "HIDDEN_DIM": 128},
                  "shape": {"B": 4096, "K": 256}, "params": {"BLOCK": 256, ...},
                  "time_us": 123.4, "default_time_us": 150.0, "validated": true}, ...]}

An entry applies when kernel and template constants match exactly, its ``source_hash`` is that
of the installed sources (``op_source_hash``: kernels, host launch code and the ops it calls)
and the shape's size lies in the range the entry stands for (between its suite neighbours, see
``size_range``); elsewhere the op uses its default and ``op.chosen`` says why. The environment variable
PYCUDA_HEADS_TUNED_DIR points at another folder of tables.
"""
from __future__ import annotations

import json
import logging
import math
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from ..records import dims_label

log = logging.getLogger("pycuda_heads")
TABLE_DIR = Path(__file__).resolve().parent.parent / "tuned"


def table_dir() -> Path:
    return Path(os.environ.get("PYCUDA_HEADS_TUNED_DIR") or TABLE_DIR)


_WARNED: set[str] = set()


@lru_cache(maxsize=None)
def _load(path: str, mtime: float) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def load_table(slug: str) -> dict[str, Any] | None:
    """The table of GPU ``slug``; None (every op uses its defaults, with one warning) when it
    is missing or unreadable."""
    path = table_dir() / f"{slug}.json"
    if not path.is_file():
        return None
    try:
        table = _load(str(path), path.stat().st_mtime)
        if not isinstance(table, dict) or not isinstance(table.get("entries", []), list):
            raise ValueError("not a table of entries")
        if not all(_well_formed(e) for e in table.get("entries", ())):
            raise ValueError("an entry lacks its kernel, template, shape or params")
    except (OSError, ValueError) as exc:
        if str(path) not in _WARNED:
            _WARNED.add(str(path))
            log.warning("tuned table %s is unreadable (%s); using the default launch "
                        "parameters", path, exc)
        return None
    return table


def _well_formed(entry: Any) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("kernel"), str) and all(
        isinstance(entry.get(k), dict) for k in ("template", "shape", "params")) and all(
        isinstance(v, int) and v > 0 for v in entry["shape"].values())


def _size(shape: Mapping[str, int]) -> float:
    return float(math.prod(max(int(v), 1) for v in shape.values()))


def size_range(sizes: list[float], i: int) -> tuple[float, float]:
    """The sizes entry ``i`` of sorted ``sizes`` stands for: from the geometric midpoint with
    its lower suite neighbour to the one with its upper neighbour. An outermost entry reaches
    as far outward as inward (a lone entry: a factor of 2 either way)."""
    s = sizes[i]
    lo = math.sqrt(sizes[i - 1] * s) if i > 0 else None
    hi = math.sqrt(sizes[i + 1] * s) if i + 1 < len(sizes) else None
    if lo is None and hi is None:
        return s / 2, s * 2
    lo = lo if lo is not None else s * s / hi
    hi = hi if hi is not None else s * s / lo
    return lo, hi


def lookup(kernel: str, template: Mapping[str, int], shape: Mapping[str, int],
           slug: str, source_hash: str | None = None) -> tuple[dict[str, Any] | None, str]:
    """(params, where they came from); params is None when no validated entry applies. With
    ``source_hash``, entries tuned for other sources are rejected.

    An entry applies only within the size range it stands for (``size_range``, sizes being the
    product of the shape's axes), so a configuration tuned at one size is never carried to a
    size it was not measured near."""
    table = load_table(slug)
    if table is None:
        return None, f"default (no tuned table for {slug})"
    template = {k: int(v) for k, v in template.items()}
    mine = sorted((e for e in table.get("entries", ())
                   if e.get("kernel") == kernel and e.get("template") == template
                   and e.get("validated") and set(e.get("shape", ())) == set(shape)),
                  key=lambda e: _size(e["shape"]))
    if not mine:
        return None, f"default (no tuned {kernel} for {template} on {slug})"
    current = [e for e in mine if source_hash is None or e.get("source_hash") == source_hash]
    if not current:
        return None, (f"default (the tuned {kernel} entries on {slug} are for other kernel "
                      f"sources, {mine[0].get('source_hash')!r} not {source_hash!r}: re-run "
                      "`pycuda-heads sweep` and `export`)")
    mine = current
    sizes, size = [_size(e["shape"]) for e in mine], _size(shape)
    # The entry tuned at this very shape, else the one whose range holds the size; of several
    # (B=4096,K=64 and B=64,K=4096 have one size) the one nearest axis by axis.
    ranges = [size_range(sizes, i) for i in range(len(mine))]
    holding = [e for e in mine if e["shape"] == dict(shape)] or \
        [e for e, (lo, hi) in zip(mine, ranges) if lo <= size <= hi]
    if holding:
        entry = min(holding, key=lambda e: sum(abs(math.log(e["shape"][a] / max(int(n), 1)))
                                               for a, n in shape.items()))
        at = dims_label(entry["shape"])
        if entry.get("kept_default"):
            return dict(entry["params"]), (f"tuned {slug} {kernel} at {at}: default kept "
                                           "(no configuration faster beyond noise)")
        return dict(entry["params"]), f"tuned {slug} {kernel} at {at}"
    lo, hi = ranges[0][0], ranges[-1][1]
    return None, (f"default ({dims_label(shape)} is outside the sizes {lo:.0f}..{hi:.0f} the "
                  f"tuned {kernel} entries on {slug} stand for)")
