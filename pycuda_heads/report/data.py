"""The stored data a report is built from, loaded without a GPU: the benchmark CSV (latest run
per gpu, op, shape, pass and provider, and the run before it), the tuning caches, the
tuner-efficiency table, the search quality record and the validation record. Any of them may be
missing or unreadable: that is recorded, never raised.
Then the benchmark rows as cases, their ratios and the team's targets."""
from __future__ import annotations

import csv
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..records import (
    BENCH_CSV,
    CACHE_GLOB,
    COMPUTE_FLOOR,
    EFFICIENCY_JSON,
    EMPTY_KERNEL,
    FWD_BWD,
    FWD_LOSS_BWD,
    NOISY_SPREAD,
    QUALITY_JSON,
    RUNS_JSON,
    SEPARATE,
    STEP_OP,
    TORCH_TRAIN_OP,
    TRAIN_ADAM_OP,
    TRAIN_STEP_OP,
    TUNING_DIR,
    VALIDATION_JSON,
    dims_label,
)

NUMERIC = ("median_us", "p20_us", "p80_us", "reps", "python_call_us", "bare_launch_us",
           "floor_bytes", "l2_cache_bytes",
           "copy_bandwidth_GBps", "max_rel_err")


@dataclass
class ReportData:
    gpu_dir: Path
    bench: list[dict[str, Any]] = field(default_factory=list)
    #: (op, shape, pass, provider) -> its newest row from before the one in ``bench``
    previous: dict[tuple[str, str, str, str], dict[str, Any]] = field(default_factory=dict)
    #: run date -> that run's empty kernel launch, GPU time in us
    empty_launch: dict[str, float] = field(default_factory=dict)
    tuning: list[dict[str, Any]] = field(default_factory=list)
    efficiency: list[dict[str, Any]] | None = None
    #: the search quality record: the samplers' curves against each task's reference best
    quality: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)  # tuning runs, oldest first
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


def _key(row: dict[str, Any]) -> tuple[str, ...]:
    return tuple(row.get(k, "") for k in ("op", "shape", "pass", "provider"))


def previous(rows: Sequence[dict[str, Any]],
             newest: Sequence[dict[str, Any]]) -> dict[tuple[str, ...], dict[str, Any]]:
    """Per (op, shape, pass, provider), the newest row dated before that key's newest row."""
    now = {_key(r): r.get("date") or "" for r in newest}
    out: dict[tuple[str, ...], dict[str, Any]] = {}
    for row in rows:
        key, date = _key(row), row.get("date") or ""
        if key in now and date < now[key] and date >= (out.get(key, {}).get("date") or ""):
            out[key] = row
    return out


def latest(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest row per (gpu, op, shape, pass, provider); on equal dates the later line wins."""
    best: dict[tuple, tuple[str, int, dict[str, Any]]] = {}
    for i, row in enumerate(rows):
        key = tuple(row.get(k, "") for k in ("gpu", "op", "shape", "pass", "provider"))
        stamp = (row.get("date") or "", i)
        if key not in best or stamp >= best[key][:2]:
            best[key] = (*stamp, row)
    return [entry[2] for entry in sorted(best.values(), key=lambda e: e[1])]


#: what every benchmark row names
KEYS = ("date", "op", "shape", "pass", "provider")


def read_bench(path: Path, bad: list[int] | None = None) -> list[dict[str, Any]]:
    """Every well-formed row of the benchmark CSV, numbers parsed; the line numbers of the
    others (too few or too many cells, a key column empty: a torn write) go to ``bad``."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = []
        for row in reader:
            if None in row or None in row.values() or not all(row.get(k) for k in KEYS):
                if bad is not None:
                    bad.append(reader.line_num)
                continue
            rows.append(row)
    for row in rows:
        for key in NUMERIC:
            row[key] = number(row.get(key))
    return rows


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
    bench = data.gpu_dir / BENCH_CSV
    if bench.is_file():
        try:
            bad: list[int] = []
            rows = read_bench(bench, bad)
            if bad:
                data.problems.append(f"`{BENCH_CSV}`: malformed line(s) {', '.join(map(str, bad))} "
                                     "left out")
            data.bench = latest(rows)
            data.previous = previous(rows, data.bench)
            data.empty_launch = {r.get("date") or "": r["median_us"] for r in rows
                                 if r.get("provider") == EMPTY_KERNEL and not r.get("error")
                                 and r.get("median_us")}
        except (OSError, csv.Error, UnicodeDecodeError) as exc:
            data.problems.append(f"`{BENCH_CSV}` could not be read: {exc}")
    else:
        data.missing.append(f"benchmark results (`{BENCH_CSV}`, written by `pycuda-heads bench`)")
    tuning = data.gpu_dir / TUNING_DIR
    caches = sorted(tuning.glob(CACHE_GLOB))
    if not caches:
        data.missing.append(f"tuning caches (`{TUNING_DIR}/<kernel>__<template>__<shape>.json`, "
                            "written by the tuner)")
    for path in caches:
        cache = _json(path, data, "tuning cache")
        if isinstance(cache, dict) and cache.get("kernel"):
            data.tuning.append({**cache, "file": path.name})
        elif cache is not None:
            data.problems.append(f"`{TUNING_DIR}/{path.name}` is not a tuning cache (no `kernel`)")
    efficiency = _json(tuning / EFFICIENCY_JSON, data, "tuner efficiency table")
    if efficiency is not None and not isinstance(efficiency, list):
        data.problems.append(f"`{TUNING_DIR}/{EFFICIENCY_JSON}` is not a list")
        efficiency = None
    data.efficiency = efficiency
    quality = _json(tuning / QUALITY_JSON, data, "search quality record")
    if quality is not None and not (isinstance(quality, dict)
                                    and isinstance(quality.get("tasks"), list)):
        data.problems.append(f"`{TUNING_DIR}/{QUALITY_JSON}` is not an object with a task list")
        quality = None
    data.quality = quality
    runs = _json(tuning / RUNS_JSON, data, "tuning run log") if caches else None
    if runs is not None and not isinstance(runs, list):
        data.problems.append(f"`{TUNING_DIR}/{RUNS_JSON}` is not a list")
        runs = None
    data.runs = [r for r in runs or () if isinstance(r, dict)]
    validation = _json(data.gpu_dir / VALIDATION_JSON, data, "GPU validation record")
    if validation is not None and not isinstance(validation, dict):
        data.problems.append(f"`{VALIDATION_JSON}` is not an object")
        validation = None
    data.validation = validation
    return data

def multi_worker_runs(runs: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """run_id -> the run-log entries of its workers (ordered by worker), for every run that
    spawned more than one worker; runs in the order they were logged."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        if isinstance(r.get("workers"), int) and r["workers"] > 1 and r.get("run_id"):
            out.setdefault(str(r["run_id"]), []).append(r)
    return {k: sorted(v, key=lambda r: r.get("worker", 0)) for k, v in out.items()}


def timed_by_several(workers: Sequence[dict[str, Any]]) -> int | None:
    """Configurations (task, point) that more than one worker timed; None when a worker's
    entry does not say what it timed."""
    seen: Counter[tuple[str, str]] = Counter()
    for w in workers:
        points = w.get("timed_points")
        if not isinstance(points, dict):
            return None
        seen.update({(task, key) for task, keys in points.items() for key in keys})
    return sum(n > 1 for n in seen.values())


def current_hashes(validation: dict[str, Any] | None) -> dict[str, str]:
    """kernel -> the source hash its family was last validated at: the sources a tuning cache
    must have been made for to speak of what is shipped."""
    return {v["kernel"]: v["source_hash"] for v in (validation or {}).get("variants", ())
            if v.get("kernel") and v.get("source_hash")}


def stale_cache(cache: dict[str, Any], current: dict[str, str]) -> bool:
    """The cache was tuned for other kernel sources than the validated ones."""
    now = current.get(cache.get("kernel", ""))
    return bool(now and cache.get("source_hash") and cache["source_hash"] != now)


# --- benchmark rows as cases (op x shape x pass, one row per provider), their ratios, targets


PROVIDERS = ("tuned", "default", "torch_eager", "torch_compile")
LABELS = {"tuned": "tuned", "default": "default", "torch_eager": "torch eager",
          "torch_compile": "torch.compile", "floor": "floor", SEPARATE: "separate ops",
          COMPUTE_FLOOR: "compute floor"}
PASS_ORDER = ("forward", "backward", FWD_BWD, FWD_LOSS_BWD)
STEP_PROVIDERS = {"library_eager": "library, kernel by kernel",
                  "library_graph": "library, CUDA graph", "torch_eager": "torch eager",
                  "torch_compile": "torch.compile",
                  "torch_compile_ro": "torch.compile reduce-overhead"}
# Head-step goals: graph replay against torch at the smallest and a mid-size shape.
STEP_GOALS = {("B=2,K=8", "torch_compile_ro"): 10.0, ("B=2,K=8", "torch_eager"): 30.0,
              ("B=256,K=64", "torch_compile_ro"): 5.0}


def step_results(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """shape -> provider -> row of the head step."""
    return _by_shape(rows, STEP_OP)


WHOLE_STEP_PROVIDERS = {**STEP_PROVIDERS, "kernel_sum": "sum of its kernels (GPU)"}
# Whole-training-step goals: (shape, provider the graph is compared with, the graph at least
# this many times faster; a goal below 1 asks the graph to be within 1/goal of it)
WHOLE_STEP_GOALS = (("B=2,K=8", "torch_compile_ro", 25.0),
                    ("B=4096,K=256", "kernel_sum", 1 / 1.15))
#: the graph's wall time per step at the smallest shape must not exceed this (us)
WHOLE_STEP_SMALL_US = 20.0
ADAM_PROVIDERS = {"library_multi": "multi-tensor launch", "torch_fused": "torch fused Adam",
                  "floor": "HBM floor"}


def whole_step_results(rows: Sequence[dict[str, Any]]
                       ) -> tuple[dict[str, dict[str, dict[str, Any]]], ...]:
    """(shape -> provider -> row) of the whole training step, and of its Adam alone."""
    return _by_shape(rows, TRAIN_STEP_OP), _by_shape(rows, TRAIN_ADAM_OP)


def _by_shape(rows: Iterable[dict[str, Any]], op: str) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        if row.get("op") == op:
            out.setdefault(row.get("shape", ""), {})[row.get("provider", "")] = row
    # "<model> <shape>" labels (the training steps) by model, then by size
    return dict(sorted(out.items(), key=lambda kv: (kv[0].rpartition(" ")[0],
                                                    shape_size(kv[0].rpartition(" ")[2]))))


TRAIN_PROVIDERS = {"library_eager": "library eager", "library_compile": "library compiled",
                   "library_compile_ro": "library reduce-overhead", "torch_eager": "torch eager",
                   "torch_compile": "torch compiled",
                   "torch_compile_ro": "torch reduce-overhead", "adam_only": "fused Adam alone"}
# PyTorch training-step goals: (library provider, torch provider, at least this speed-up, at
# which shapes: None for every one)
TRAIN_GOALS = (("library_compile_ro", "torch_compile_ro", 1.0, None),
               ("library_eager", "torch_eager", 1.0, None),
               ("library_eager", "torch_compile", 2.0, "pool B=4096,K=256"))


def train_results(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """"<model> <shape>" -> provider -> row of the PyTorch training steps."""
    return _by_shape(rows, TORCH_TRAIN_OP)

# A case is called changed only beyond this much, plus its run's own noise (``Change.band``).
CHANGE_BAND = 0.05

# The team's goals, measured on the H200.
FLOOR_GOAL = 0.75     # largest shapes, fwd+bwd: fraction of the copy-bandwidth floor
COMPILE_GOAL = 5.0    # largest shapes, fwd+bwd: speed-up over torch.compile
EMPTY_GOAL = 2.0      # smallest shapes: GPU time over one empty kernel launch
HOST_GOAL = 2.0       # smallest shapes: host cost of a call over that of its bare launches


def shape_text(shape: Any) -> str:
    """A shape as the CSV spells it ('B=4096,K=256'), from a dict or a string."""
    return dims_label(shape) if isinstance(shape, dict) else str(shape or "")


def shape_size(shape: str) -> int:
    """'B=4096,K=256' -> 4096*256: orders the shapes of an op."""
    sizes = []
    for part in shape.split(","):
        try:
            sizes.append(int(part.split("=", 1)[1]))
        except (IndexError, ValueError):
            return 0
    return math.prod(sizes)


@dataclass
class BenchResult:
    op: str
    shape: str
    pass_: str
    rows: dict[str, dict[str, Any]]

    def time(self, provider: str) -> float | None:
        row = self.rows.get(provider)
        return row.get("median_us") if row and not row.get("error") else None

    def error(self, provider: str) -> str | None:
        row = self.rows.get(provider)
        return (row.get("error") or None) if row else None

    def call_us(self, provider: str) -> float | None:
        row = self.rows.get(provider)
        return row.get("python_call_us") if row and not row.get("error") else None

    def noisy(self, provider: str) -> bool:
        """Whether the timing stayed noisy (p80/p20 above NOISY_SPREAD) after a second try."""
        row = self.rows.get(provider) or {}
        if str(row.get("noisy", "")).strip() in ("1", "1.0", "True"):
            return True
        p20, p80 = row.get("p20_us"), row.get("p80_us")
        return bool(p20 and p80 and p80 / p20 > NOISY_SPREAD)

    def chosen(self, provider: str) -> dict[str, dict[str, Any]]:
        """role -> the op's ``chosen`` entry (params, source), from the bench's config column."""
        try:
            chosen = json.loads((self.rows.get(provider) or {}).get("config") or "{}")
        except ValueError:
            return {}
        return {role: c for role, c in chosen.items() if isinstance(c, dict)}

    def launch(self, provider: str) -> dict[str, Any] | None:
        """role -> launch parameters the provider ran with."""
        return {role: c.get("params") for role, c in self.chosen(provider).items()} or None

    def over_tuned(self, provider: str) -> float | None:
        """``provider``'s time over the tuned time: the tuned kernels' speed-up over it."""
        t, other = self.time("tuned"), self.time(provider)
        return other / t if t and other else None

    @property
    def floor_fraction(self) -> float | None:
        """Floor time over tuned time; None where the pass's data sits in L2, where the DRAM
        floor says nothing (``l2_resident``)."""
        return None if self.l2_resident else self.over_tuned("floor")

    @property
    def l2_resident(self) -> bool:
        """The pass's bytes fit the GPU's L2 (as the bench read it off the device), or it ran
        faster than moving them through DRAM could: a cache served them."""
        tuned, floor = self.rows.get("tuned") or {}, self.rows.get("floor") or {}
        l2, moved = tuned.get("l2_cache_bytes"), floor.get("floor_bytes")
        if l2 and moved and moved <= l2:
            return True
        x = self.over_tuned("floor")
        return x is not None and x > 1


def pass_order(pass_: str) -> tuple[int, str]:
    return (PASS_ORDER.index(pass_) if pass_ in PASS_ORDER else len(PASS_ORDER), pass_)


def cases(rows: Iterable[dict[str, Any]]) -> list[BenchResult]:
    """The kernel ops' results (the head step's and training steps' rows have their own
    sections)."""
    grouped: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for row in rows:
        if row.get("op") in (EMPTY_KERNEL, STEP_OP, TORCH_TRAIN_OP, TRAIN_STEP_OP,
                             TRAIN_ADAM_OP):
            continue
        key = (row.get("op", ""), row.get("shape", ""), row.get("pass", ""))
        grouped.setdefault(key, {})[row.get("provider", "")] = row
    out = [BenchResult(op, shape, pass_, r) for (op, shape, pass_), r in grouped.items()]
    first = {op: i for i, op in enumerate(dict.fromkeys(c.op for c in out))}
    out.sort(key=lambda c: (first[c.op], shape_size(c.shape), c.shape, pass_order(c.pass_)))
    return out


def empty_kernel_us(rows: Iterable[dict[str, Any]]) -> float | None:
    for row in rows:
        if row.get("provider") == EMPTY_KERNEL and not row.get("error"):
            return row.get("median_us")
    return None


def ops(all_cases: Sequence[BenchResult]) -> list[str]:
    """The ops in the order the benchmark wrote them."""
    return list(dict.fromkeys(c.op for c in all_cases))


def extreme_cases(all_cases: Sequence[BenchResult], op: str, largest: bool) -> list[BenchResult]:
    """The cases of ``op`` at its largest (or smallest) measured shape of the suite's model
    size: a wide model (its label names template constants, HIDDEN_DIM=512) is another head,
    not a larger batch of this one."""
    mine = [c for c in all_cases if c.op == op]
    suite = [c for c in mine if all(len(part.split("=", 1)[0]) == 1
                                    for part in c.shape.split(","))]
    mine = suite or mine
    if not mine:
        return []
    pick = (max if largest else min)(shape_size(c.shape) for c in mine)
    return [c for c in mine if shape_size(c.shape) == pick]


@dataclass
class Change:
    """A case's tuned time now against its newest earlier measurement, with each run's empty
    kernel launch (what tells a slower machine or day from a slower kernel)."""
    case: BenchResult
    before: dict[str, Any]  # the earlier row
    empty_before: float | None
    empty_now: float | None

    @property
    def ratio(self) -> float:
        return self.case.time("tuned") / self.before["median_us"]

    @property
    def band(self) -> float:
        """How far the ratio may stray from 1 by noise alone: ``CHANGE_BAND``, plus how much
        the empty kernel launch itself moved between the two runs (a slower machine or day),
        plus the wider of the two measurements' p20-p80 spreads."""
        drift = abs(self.empty_now / self.empty_before - 1) \
            if self.empty_now and self.empty_before else 0.0
        spreads = [(r.get("p80_us") - r.get("p20_us")) / r["median_us"]
                   for r in (self.before, self.case.rows.get("tuned") or {})
                   if r.get("median_us") and r.get("p20_us") is not None
                   and r.get("p80_us") is not None]
        return CHANGE_BAND + drift + max(spreads, default=0.0)

    @property
    def moved(self) -> int:
        """+1 slower beyond the noise band (a regression), -1 faster beyond it, 0 within."""
        return (self.ratio > 1 + self.band) - (self.ratio < 1 - self.band)


def changes(all_cases: Sequence[BenchResult], data: ReportData) -> list[Change]:
    out = []
    for c in all_cases:
        before = data.previous.get((c.op, c.shape, c.pass_, "tuned"))
        if c.time("tuned") and before and not before.get("error") and before.get("median_us"):
            now = c.rows["tuned"].get("date") or ""
            out.append(Change(c, before, data.empty_launch.get(before.get("date") or ""),
                              data.empty_launch.get(now)))
    return out


@dataclass
class Target:
    goal: str      # which of the three goals
    case: BenchResult
    value: float | None
    met: bool | None  # None: not measured
    detail: str


def _floor_target(case: BenchResult) -> Target:
    f, t, floor = case.floor_fraction, case.time("tuned"), case.time("floor")
    if case.l2_resident:
        return Target("floor", case, None, None, "its data fits in L2: no DRAM floor applies")
    if f is None or t is None or floor is None:
        return Target("floor", case, None, None, _why_unmeasured(case, ("tuned", "floor")))
    if f >= FLOOR_GOAL:
        return Target("floor", case, f, True, f"reaches {f:.0%} of the floor")
    return Target("floor", case, f, False,
                  f"reaches {f:.0%} of the floor, {100 * (FLOOR_GOAL - f):.0f} points short: "
                  f"needs {FLOOR_GOAL / f:.2f}x faster (<= {floor / FLOOR_GOAL:.1f} us)")


def _compile_target(case: BenchResult) -> Target:
    x, compiled = case.over_tuned("torch_compile"), case.time("torch_compile")
    if x is None or compiled is None:
        return Target("compile", case, None, None,
                      _why_unmeasured(case, ("tuned", "torch_compile")))
    if x >= COMPILE_GOAL:
        return Target("compile", case, x, True, f"{speedup_text(x)} than torch.compile")
    return Target("compile", case, x, False,
                  f"{speedup_text(x)} than torch.compile: needs {COMPILE_GOAL / x:.2f}x faster "
                  f"(<= {compiled / COMPILE_GOAL:.1f} us)")


def speedup_text(x: float) -> str:
    """'2.53x faster', or for a ratio below 1 '4.50x slower' (never '0.22x faster')."""
    return f"{x:.2f}x faster" if x >= 1 else f"{1 / x:.2f}x slower"


def _empty_target(case: BenchResult, empty_us: float | None) -> Target:
    t = case.time("tuned")
    if t is None or not empty_us:
        why = "no empty-kernel measurement" if not empty_us else _why_unmeasured(case, ("tuned",))
        return Target("empty", case, None, None, why)
    r = t / empty_us
    if r < 1:  # a family launched with programmatic dependent launch
        return Target("empty", case, r, True,
                      f"{r:.2f}x an empty launch: below one where programmatic dependent "
                      "launch overlaps launch latency that the plain empty launch pays")
    if r <= EMPTY_GOAL:
        return Target("empty", case, r, True, f"{r:.2f}x an empty launch")
    return Target("empty", case, r, False,
                  f"{r:.2f}x an empty launch: {r / EMPTY_GOAL:.2f}x too slow "
                  f"(needs <= {EMPTY_GOAL * empty_us:.1f} us)")


def _host_target(case: BenchResult) -> Target:
    row = case.rows.get("tuned") or {}
    call, bare = case.call_us("tuned"), row.get("bare_launch_us")
    if call is None or not bare:
        return Target("host", case, None, None, "no bare-launch measurement in this run"
                      if call is not None else _why_unmeasured(case, ("tuned",)))
    r = call / bare
    detail = f"{call:.1f} us per call, {r:.2f}x its bare launches ({bare:.1f} us)"
    if r <= HOST_GOAL:
        return Target("host", case, r, True, detail)
    return Target("host", case, r, False, f"{detail}: needs <= {HOST_GOAL * bare:.1f} us")


def _why_unmeasured(case: BenchResult, providers: Sequence[str]) -> str:
    reasons = []
    for p in providers:
        if case.time(p) is None:
            err = case.error(p)
            reasons.append(f"{LABELS[p]} {'failed: ' + err if err else 'not measured'}")
    return "; ".join(reasons) or "not measured"


def targets(all_cases: Sequence[BenchResult], empty_us: float | None) -> list[Target]:
    """Every target of every op: the two largest-shape goals on fwd+bwd, then the small-shape
    goals: GPU time on every pass, host cost on each kernel pass (FRD's one fused pass)."""
    out: list[Target] = []
    for op in ops(all_cases):
        for case in extreme_cases(all_cases, op, largest=True):
            if case.pass_ == FWD_BWD:
                out += [_floor_target(case), _compile_target(case)]
    for op in ops(all_cases):
        out += [_empty_target(c, empty_us) for c in extreme_cases(all_cases, op, largest=False)]
    for op in ops(all_cases):
        out += [_host_target(c) for c in extreme_cases(all_cases, op, largest=False)
                if c.pass_ not in (FWD_BWD, FWD_LOSS_BWD) or op == "frd"]
    return out
