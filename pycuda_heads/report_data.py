"""The stored data a report is built from, loaded without a GPU: the benchmark CSV (latest run
per gpu, op, shape, pass and provider), the tuning caches, the tuner-efficiency table and the
validation record. Any of them may be missing or unreadable: that is recorded, never raised."""
from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

NUMERIC = ("median_us", "p20_us", "p80_us", "reps", "python_call_us", "floor_bytes",
           "copy_bandwidth_GBps", "max_rel_err")
EFFICIENCY = "efficiency.json"
CACHES = "*__*__*.json"  # the tuner's cache names: <kernel>__<template>__<shape>.json


@dataclass
class ReportData:
    gpu_dir: Path
    bench: list[dict[str, Any]] = field(default_factory=list)
    tuning: list[dict[str, Any]] = field(default_factory=list)
    efficiency: list[dict[str, Any]] | None = None
    validation: dict[str, Any] | None = None
    missing: list[str] = field(default_factory=list)   # inputs that are absent, as sentences
    problems: list[str] = field(default_factory=list)  # inputs that could not be read

    @property
    def slug(self) -> str:
        return self.gpu_dir.name

    @property
    def gpu(self) -> str:
        """The GPU's name as the data spells it, else the folder name."""
        for source in (self.bench, [self.validation or {}], self.tuning):
            for item in source:
                if item.get("gpu"):
                    return str(item["gpu"])
        return self.slug


def number(text: Any) -> float | None:
    """A CSV cell as a finite float, None when empty or not a number."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def latest(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest row per (gpu, op, shape, pass, provider); on equal dates the later line wins."""
    best: dict[tuple, tuple[str, int, dict[str, Any]]] = {}
    for i, row in enumerate(rows):
        key = tuple(row.get(k, "") for k in ("gpu", "op", "shape", "pass", "provider"))
        stamp = (row.get("date") or "", i)
        if key not in best or stamp >= best[key][:2]:
            best[key] = (*stamp, row)
    return [entry[2] for entry in sorted(best.values(), key=lambda e: e[1])]


def read_bench(path: Path) -> list[dict[str, Any]]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for key in NUMERIC:
            row[key] = number(row.get(key))
    return latest(rows)


def _json(path: Path, data: ReportData, what: str) -> Any:
    if not path.is_file():
        data.missing.append(f"{what} (`{path.relative_to(data.gpu_dir)}`)")
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        data.problems.append(f"`{path.relative_to(data.gpu_dir)}` could not be read: {exc}")
        return None


def load(gpu_dir: Path) -> ReportData:
    """Everything stored under ``reports/<gpu-slug>/``."""
    data = ReportData(Path(gpu_dir))
    bench = data.gpu_dir / "bench.csv"
    if bench.is_file():
        try:
            data.bench = read_bench(bench)
        except (OSError, csv.Error, UnicodeDecodeError) as exc:
            data.problems.append(f"`bench.csv` could not be read: {exc}")
    else:
        data.missing.append("benchmark results (`bench.csv`, written by `pycuda-heads bench`)")
    tuning = data.gpu_dir / "tuning"
    caches = sorted(tuning.glob(CACHES))
    if not caches:
        data.missing.append("tuning caches (`tuning/<kernel>__<template>__<shape>.json`, "
                            "written by the tuner)")
    for path in caches:
        cache = _json(path, data, "tuning cache")
        if isinstance(cache, dict) and cache.get("kernel"):
            data.tuning.append({**cache, "file": path.name})
        elif cache is not None:
            data.problems.append(f"`tuning/{path.name}` is not a tuning cache (no `kernel`)")
    efficiency = _json(tuning / EFFICIENCY, data, "tuner efficiency table")
    if efficiency is not None and not isinstance(efficiency, list):
        data.problems.append(f"`tuning/{EFFICIENCY}` is not a list")
        efficiency = None
    data.efficiency = efficiency
    validation = _json(data.gpu_dir / "validation.json", data, "GPU validation record")
    if validation is not None and not isinstance(validation, dict):
        data.problems.append("`validation.json` is not an object")
        validation = None
    data.validation = validation
    return data
