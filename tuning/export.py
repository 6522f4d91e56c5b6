"""``export``: the best validated configuration of every tuned task -> the per-GPU table the
ops read at run time (``pycuda_heads/tuned/<slug>.json``, format in ``tuned_params``), with
provenance: date, commit, trials run, tuning time, validation summary."""
from __future__ import annotations

import datetime as dt
import logging
import math
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pycuda_heads import records

from .cache import FAILED_VALIDATION, beats_default
from .storage import cache_files, read_runs, tuning_dir

log = logging.getLogger("pycuda_heads.tuning")


def installed_hash(kernel: str) -> str | None:
    """The source hash of ``kernel`` as installed; None for a kernel the catalog lacks."""
    from pycuda_heads.catalog import catalog
    from pycuda_heads.core.op import op_source_hash
    return op_source_hash(catalog()[kernel].op) if kernel in catalog() else None


def suite_shapes(kernel: str) -> list[dict[str, int]] | None:
    """The suite shapes of ``kernel`` at the suite template; None for a kernel the catalog
    lacks."""
    from pycuda_heads.catalog import SUITE_TEMPLATE, catalog
    if kernel not in catalog():
        return None
    return [dict(shape) for spec, template, shape in catalog().tasks()
            if spec.id == kernel and template == spec.template(SUITE_TEMPLATE)]


def build_table(reports: Path, slug: str,
                installed: Callable[[str], str | None] = installed_hash,
                suite: Callable[[str], list[dict[str, int]] | None] = suite_shapes,
                shipped: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The table of ``slug`` from its caches; a cache tuned for other sources than the
    installed ones (``installed``) is left out and listed as stale, unless ``shipped`` (the
    installed table's entries) holds its task's entry at the installed sources: one that
    ``restamp`` carried over, proven to compile as before, which is kept as it is. That entry
    is kept too while a re-tune at the installed sources has not compared its best with the
    default yet (a run cut short), which would otherwise ship the default. A kernel
    ships only with an entry at every one of its ``suite`` shapes: an entry's size range
    reaches to its suite neighbours, so a missing neighbour would stretch it over shapes never
    tuned."""
    tdir = tuning_dir(reports, slug)
    caches, stale, carried = [], [], []
    for path in cache_files(tdir):
        c = read_cache(path)
        now = installed(c["kernel"])
        if now is not None and c.get("source_hash") != now:
            kept = _shipped_entries(shipped, c, now)
            if kept:
                log.info("%s: tuned for other kernel sources; the shipped entry, carried over "
                         "to the installed ones, is kept", path)
                carried += kept
                continue
            log.warning("%s: tuned for other kernel sources (%s, installed %s); not exported",
                        path, c.get("source_hash"), now)
            stale.append(path.name)
        else:
            caches.append(c)
    if not caches and not carried:
        raise FileNotFoundError(f"no tuning data for the installed sources in {tdir}; run "
                                "`pycuda-heads sweep` first")
    entries, missing, failures = [], [], []
    for c in caches:
        evals = c["evaluations"]
        failures += [{"kernel": c["kernel"], "shape": c["shape"], "params": e["params"],
                      "reason": e["reason"]} for e in evals if e["state"] == FAILED_VALIDATION]
        best = c["best"]
        entry = None if best is None or not _finite(best["time_us"]) \
            else _entry(c, next(e for e in evals if e["params"] == best["params"]))
        if entry is None or entry["p_value"] is None:  # a re-tune not finished
            kept = _shipped_entries(shipped, c, c.get("source_hash"))
            if kept:
                log.info("%s %s: its re-tune has not compared a validated best with the "
                         "default yet; the shipped entry is kept", c["kernel"], c["shape"])
                carried += kept
                continue
        if entry is None:
            missing.append({"kernel": c["kernel"], "template": c["template"], "shape": c["shape"]})
        else:
            entries.append(entry)
    entries += carried
    incomplete = {}
    for kernel in sorted({e["kernel"] for e in entries}):
        have = [e["shape"] for e in entries if e["kernel"] == kernel]
        lacking = [shape for shape in suite(kernel) or () if shape not in have]
        if lacking:
            log.warning("%s: not tuned at %s; none of its entries exported", kernel, lacking)
            incomplete[kernel] = lacking
    entries = [e for e in entries if e["kernel"] not in incomplete]
    entries.sort(key=lambda e: (e["kernel"], sorted(e["template"].items()),
                                sorted(e["shape"].items())))
    runs = read_runs(tdir)
    return {
        "gpu": (caches[0] if caches else read_cache(cache_files(tdir)[0]))["gpu"], "slug": slug,
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
            "stale_caches_skipped": stale,
            "entries_kept_from_the_shipped_table": len(carried),
            "kernels_not_tuned_at_every_suite_shape": incomplete,
        },
        "entries": entries,
    }


# what export and efficiency read of a cache without a further check, and its JSON types
_FIELDS = {"kernel": str, "template": dict, "shape": dict, "gpu": str, "gpu_slug": str,
           "default_params": dict, "evaluations": list, "history": list}
_EVALUATION = ("params", "state", "time_us", "p20_us", "p80_us", "reason")


def read_cache(path: Path) -> dict[str, Any]:
    """The JSON of the cache file ``path``; a ValueError in one line naming the file when it is
    not a cache record."""
    data = records.read_json(path, "tuning cache")
    problem = _cache_problem(data)
    if problem:
        raise ValueError(f"tuning cache {path} is not a cache record ({problem}); delete or "
                         "restore it")
    return data


def _cache_problem(c: Any) -> str | None:
    if not isinstance(c, dict):
        return f"a JSON {type(c).__name__}, not an object"
    for key, kind in _FIELDS.items():
        if not isinstance(c.get(key), kind):
            return f"{key!r} missing or not a {kind.__name__}"
    evals = c["evaluations"]
    if not all(isinstance(e, dict) and all(k in e for k in _EVALUATION) for e in evals):
        return f"an evaluation lacks one of {', '.join(_EVALUATION)}"
    if not all(isinstance(h, dict) and "study" in h for h in c["history"]):
        return "a history entry names no study"
    best = c.get("best")
    if best is not None and not (isinstance(best, dict) and "time_us" in best
                                 and any(e["params"] == best.get("params") for e in evals)):
        return "'best' is not one of its evaluations"
    return None


def _shipped_entries(shipped: Sequence[Mapping[str, Any]], c: Mapping[str, Any],
                     source_hash: str | None) -> list[dict[str, Any]]:
    """The installed table's entries for the task of cache ``c`` at ``source_hash``."""
    return [dict(e) for e in shipped if e.get("source_hash") == source_hash
            and (e["kernel"], e["template"], e["shape"]) == (c["kernel"], c["template"],
                                                              c["shape"])]


def _finite(t: Any) -> bool:
    return isinstance(t, (int, float)) and math.isfinite(t)


def export(reports: Path, slug: str, out_dir: Path,
           installed: Callable[[str], str | None] = installed_hash) -> Path:
    """Write ``slug``'s table into ``out_dir``, keeping the installed table's entries that
    ``restamp`` carried over where their caches are stale."""
    from pycuda_heads.core.tuned import table_dir
    path = table_dir() / f"{slug}.json"
    shipped = records.read_json(path, "tuned table").get("entries", []) if path.is_file() else []
    table = build_table(reports, slug, installed, shipped=shipped)
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
    comparison found it faster than the default beyond noise, else the default (kept). The
    default is the cache's ``default_params``: the point the op runs without a tuned entry."""
    cmp = c.get("comparison") or {}
    # a verdict against another point says nothing of this default; one from an older tuner
    # names no point: it was reached against the default_params written with it
    if cmp.get("default_params", c["default_params"]) != c["default_params"]:
        cmp = {}
    if cmp.get("params") != best["params"]:  # nor does one on an earlier best of a resumed study
        cmp = {}
    # decided from p and interval, so verdicts recorded under an older rule follow today's
    ship = beats_default(cmp)
    default = next((e for e in c["evaluations"] if e["params"] == c["default_params"]), None)
    chosen = best if ship else default
    if chosen is not None and not _finite(chosen["time_us"]):  # a timing from an older tuner
        chosen = None
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
        "p80_us": chosen and chosen["p80_us"],
        "default_time_us": c["default_time_us"] if _finite(c["default_time_us"]) else None,
        "best_params": best["params"], "best_time_us": best["time_us"],
        "speedup": cmp.get("speedup"), "speedup_ci95": cmp.get("ci"),
        "p_value": cmp.get("p_value"), "source_hash": c.get("source_hash", ""),
    }
