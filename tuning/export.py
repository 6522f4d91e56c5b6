"""``export``: the best validated configuration of every tuned task -> the per-GPU table the
ops read at run time (``pycuda_heads/tuned/<slug>.json``, format in ``tuned_params``), with
provenance: date, commit, trials run, tuning time, validation summary."""
from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from pycuda_heads import records

from .cache import FAILED_VALIDATION
from .storage import cache_files, read_runs, tuning_dir


def build_table(reports: Path, slug: str) -> dict[str, Any]:
    tdir = tuning_dir(reports, slug)
    caches = [records.read_json(p, "tuning cache") for p in cache_files(tdir)]
    if not caches:
        raise FileNotFoundError(f"no tuning data in {tdir}; run `pycuda-heads sweep` first")
    entries, missing, failures = [], [], []
    for c in caches:
        evals = c["evaluations"]
        failures += [{"kernel": c["kernel"], "shape": c["shape"], "params": e["params"],
                      "reason": e["reason"]} for e in evals if e["state"] == FAILED_VALIDATION]
        if c["best"] is None:
            missing.append({"kernel": c["kernel"], "template": c["template"], "shape": c["shape"]})
            continue
        entries.append(_entry(c, next(e for e in evals if e["params"] == c["best"]["params"])))
    entries.sort(key=lambda e: (e["kernel"], sorted(e["template"].items()),
                                sorted(e["shape"].items())))
    runs = read_runs(tdir)
    return {
        "gpu": caches[0]["gpu"], "slug": slug,
        "provenance": {
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            **_git(reports),
            "trials_run": sum(len(c["history"]) for c in caches),
            "configurations_timed": sum(e["time_us"] is not None
                                        for c in caches for e in c["evaluations"]),
            "tuning_wall_s": round(sum(r.get("wall_s", 0.0) for r in runs), 1),
            "tuning_runs": len(runs),
            "validation": {
                "exported": len(entries),
                "exported_validated": sum(e["validated"] for e in entries),
                "configurations_passed": sum(e["validated"] for c in caches
                                             for e in c["evaluations"]),
                "configurations_failed": len(failures),
                "failures": failures,
                "tasks_without_validated_best": missing,
            },
        },
        "entries": entries,
    }


def export(reports: Path, slug: str, out_dir: Path) -> Path:
    table = build_table(reports, slug)
    path = Path(out_dir) / f"{slug}.json"
    records.write_json(path, table)
    return path


def slugs_with_data(reports: Path) -> list[str]:
    return sorted(p.parent.name for p in Path(reports).glob("*/tuning") if cache_files(p))


def _git(where: Path) -> dict[str, Any]:
    state = records.git_state(where)
    return {"git_commit": state["commit"], "git_dirty": state["dirty"]}


def _entry(c: dict[str, Any], best: dict[str, Any]) -> dict[str, Any]:
    """The table entry of one task: the best validated configuration when the interleaved
    comparison found it faster than the default beyond noise, else the default (kept)."""
    cmp = c.get("comparison") or {}
    ship = bool(cmp.get("significant")) and cmp.get("params") == best["params"]
    default = next((e for e in c["evaluations"] if e["params"] == c["default_params"]), None)
    chosen = best if ship else default
    why = ("faster than the default beyond noise" if ship
           else "not compared with the default yet" if not cmp
           else "the default is the best" if best["params"] == c["default_params"]
           else "not faster than the default beyond noise")
    return {
        "kernel": c["kernel"], "template": c["template"], "shape": c["shape"],
        "params": best["params"] if ship else c["default_params"],
        "kept_default": not ship, "why": why,
        "validated": bool(chosen and chosen.get("validated")),
        "time_us": chosen and chosen["time_us"], "p20_us": chosen and chosen["p20_us"],
        "p80_us": chosen and chosen["p80_us"], "default_time_us": c["default_time_us"],
        "best_params": best["params"], "best_time_us": best["time_us"],
        "speedup": cmp.get("speedup"), "speedup_ci95": cmp.get("ci"),
        "p_value": cmp.get("p_value"), "source_hash": c.get("source_hash", ""),
    }
