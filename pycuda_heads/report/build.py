"""``pycuda-heads report``: turn the stored benchmark, tuning and validation data of each GPU
into ``reports/<gpu-slug>/README.md`` with PNG plots beside it, and ``reports/README.md`` as the
index. Needs no GPU; missing inputs are named in the report instead of failing it."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from .. import records
from ..progress import Steps
from . import data as report_data
from . import plots as report_plots
from . import tables as report_tables

# What makes a folder under reports/ a GPU's folder.
_DATA = (records.BENCH_CSV, records.VALIDATION_JSON, records.TUNING_DIR)


def build(gpu_dir: Path) -> Path:
    """Write ``gpu_dir/README.md`` and its plots from the data in ``gpu_dir``."""
    gpu_dir = Path(gpu_dir)
    gpu_dir.mkdir(parents=True, exist_ok=True)
    data = report_data.load(gpu_dir)
    cases = report_data.cases(data.bench)
    empty_us = report_data.empty_kernel_us(data.bench)
    parts = [report_tables.header(data, empty_us), report_tables.inputs(data),
             report_tables.headline(cases),
             report_tables.targets(report_data.targets(cases, empty_us), empty_us),
             report_tables.changes(report_data.changes(cases, data))]
    if cases:
        parts.append("## Results per op\n")
    written: set[str] = set()
    smoke_file = gpu_dir / records.SMOKE_JSON
    steps = Steps(2 * len(report_data.ops(cases)) + len(data.tuning) + smoke_file.is_file(),
                  f"report {data.slug}", "plot")
    for op in report_data.ops(cases):
        mine = [c for c in cases if c.op == op]
        plots = [name for name, draw in (
            (f"{op}_time.png", lambda p: report_plots.op_times(op, data.gpu, mine, empty_us, p)),
            (f"{op}_floor.png", lambda p: report_plots.op_floor(op, data.gpu, mine, p)))
            if _drawn(draw(gpu_dir / name), steps, name)]
        written.update(plots)
        parts.append(report_tables.op_section(op, mine, plots))
    parts.append(report_tables.step(report_data.step_results(data.bench)))
    parts.append(report_tables.whole_step(*report_data.whole_step_results(data.bench)))
    parts.append(report_tables.torch_train(report_data.train_results(data.bench)))
    parts.append(report_tables.sweep(data.runs))
    parts.append(report_tables.worker_runs(data.runs))
    tuning_plots = _tuning_plots(data, steps)
    written.update(tuning_plots.values())
    parts.append(report_tables.tuning(data, tuning_plots))
    parts.append(report_tables.efficiency(data))
    quality_plots = _quality_plots(data)
    written.update(quality_plots.values())
    parts.append(report_tables.quality(data, quality_plots))
    parts.append(report_tables.validation(data))
    if smoke_file.is_file():
        try:
            result = records.read_json(smoke_file, "smoke training record")
            if not isinstance(result, dict):
                raise ValueError(f"{smoke_file.name} is not an object")
            plot = "smoke_loss.png"
            drawn = _drawn(report_plots.smoke_losses(result, data.gpu, gpu_dir / plot), steps,
                           plot)
            written.update([plot] if drawn else [])
            parts.append(report_tables.smoke(result, plot if drawn else None))
        except ValueError as exc:
            parts.append(f"Smoke training record unreadable: {exc}\n")
    steps.close()
    phase_file = gpu_dir / records.PHASES_JSON
    if phase_file.is_file():
        try:
            parts.append(report_tables.phases(records.read_json(phase_file, "phase log")))
        except ValueError as exc:
            parts.append(f"Phase log unreadable: {exc}\n")
    if cases:
        parts.append(report_tables.METHOD)
    if report_plots.available():
        for stale in set(p.name for p in gpu_dir.glob("*.png")) - written:
            (gpu_dir / stale).unlink()  # a plot of data no longer there would mislead
    else:
        parts.insert(2, "Plots are not drawn: matplotlib is missing (pip install '.[report]').\n")
    path = gpu_dir / "README.md"
    records.write_text(path, "\n".join(p for p in parts if p).rstrip("\n") + "\n")
    return path


def _drawn(drawn: bool, steps: Steps, name: str) -> bool:
    steps.step(name)  # plots are where a report's time goes
    return drawn


def _tuning_plots(data: report_data.ReportData, steps: Steps) -> dict[str, str]:
    """cache file -> plot file, drawn into the GPU folder."""
    exhaustive = {(e.get("kernel"), _key(e.get("shape"))): e.get("exhaustive_best_us")
                  for e in data.efficiency or ()}
    plots = {}
    for cache in data.tuning:
        name = f"tuning_{records.slug(Path(cache['file']).stem)}.png"
        best = exhaustive.get((cache["kernel"], _key(cache.get("shape"))))
        if _drawn(report_plots.tuning(cache, data.gpu, best, data.gpu_dir / name), steps, name):
            plots[cache["file"]] = name
    return plots


def _quality_plots(data: report_data.ReportData) -> dict[str, str]:
    """task label -> plot file of its search quality curves, drawn into the GPU folder."""
    plots = {}
    for e in (data.quality or {}).get("tasks", []):
        label = f"{e.get('kernel')}__{records.dims_label(e.get('template') or {})}__" \
                f"{records.dims_label(e.get('shape') or {})}"
        name = f"quality_{records.slug(label)}.png"
        if report_plots.quality(e, data.gpu, data.gpu_dir / name):
            plots[label] = name
    return plots


def _key(shape: Any) -> str:
    return json.dumps(shape, sort_keys=True)


def gpu_dirs(root: Path) -> list[Path]:
    return sorted(p for p in Path(root).iterdir()
                  if p.is_dir() and any((p / name).exists() for name in _DATA))


def build_index(root: Path) -> Path:
    """``root/README.md``: one line per GPU folder, linking its report."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for d in gpu_dirs(root):
        data = report_data.load(d)
        dates = sorted({r.get("date", "") for r in data.bench} - {""})
        commits = {report_tables.commit(r.get("commit")) for r in data.bench
                   if r.get("date") == (dates or [""])[-1]}
        rows.append((data.gpu, dates[-1] if dates else "no benchmark", ", ".join(sorted(commits))
                     or "–", f"[{d.name}/README.md]({d.name}/README.md)"))
    lines = ["# Performance reports", "",
             "One folder per GPU: its benchmark data (`bench.csv`), tuning caches, validation "
             "record, and the report generated from them by `pycuda-heads report`. The "
             "measurements come from `pycuda-heads bench` on that GPU.", ""]
    lines.append(report_tables.table(("GPU", "latest benchmark", "commit", "report"), rows)
                 if rows else "No GPU has data yet: run `pycuda-heads bench` on one.")
    path = root / "README.md"
    records.write_text(path, "\n".join(lines) + "\n")
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("reports"),
                        help="the results folder, one sub-folder per GPU (default: reports)")
    parser.add_argument("--gpu", type=records.slugs, metavar="SLUG[,SLUG]",
                        help="GPU folders to rebuild (default: every folder holding data)")
    parser.set_defaults(reads_out=True)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("report", help="write the per-GPU reports and their index "
                                                  "from stored data (no GPU)",
                                   description=__doc__)
    add_arguments(parser)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    root = Path(args.out)
    if not root.is_dir():
        print(f"pycuda-heads report: --out {root} is not a folder", file=sys.stderr)
        return 2
    known = [d.name for d in gpu_dirs(root)]
    unknown = [slug for slug in args.gpu or () if slug not in known]
    if unknown:  # building it would write a report of nothing into a new folder
        print(f"pycuda-heads report: --gpu {','.join(unknown)}: no data under {root}; GPUs with "
              f"data: {', '.join(known) or 'none'}", file=sys.stderr)
        return 2
    if not report_plots.available():
        print("pycuda-heads report: matplotlib is missing, so no plots are drawn; install the "
              "report extra: pip install '.[report]'", file=sys.stderr)
    slugs: Sequence[str] = args.gpu or known
    for slug in slugs:  # no phase logged: the report changes no data file it reads
        print(f"wrote {build(root / slug)}")
    print(f"wrote {build_index(root)}")
    return 0

