"""The tuning subcommands of ``pycuda-heads``: tune, sweep, export, efficiency."""
from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import time
from pathlib import Path

from pycuda_heads import records

log = logging.getLogger("pycuda_heads.tuning")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="tune one kernel at one shape on this GPU")
    p.add_argument("--kernel", required=True, help="e.g. pool.forward")
    p.add_argument("--shape", required=True, help="e.g. B=4096,K=256")
    p.add_argument("--template", default=None,
                   help="template constants, e.g. N_HORIZONS=5,HIDDEN_DIM=128 (default: suite)")
    _search_options(p, mode="tpe")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("sweep", help="tune every kernel x shape of the suite on this GPU")
    p.add_argument("--kernels", default=None, help="comma-separated subset (default: all)")
    _search_options(p, mode="tpe")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("export", help="best validated configurations -> the package's table")
    p.add_argument("--slug", default=None, help="GPU slug (default: every GPU with data)")
    p.add_argument("--reports", type=Path, default=Path("reports"))
    p.add_argument("--out", type=Path, default=None,
                   help="table folder (default: the package's pycuda_heads/tuned)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("efficiency", help="trials TPE needs to come within 3%% of the "
                                          "exhaustive best (CPU replay of the caches)")
    p.add_argument("--slug", default=None, help="GPU slug (default: every GPU with data)")
    p.add_argument("--reports", type=Path, default=Path("reports"))
    p.add_argument("--seeds", type=int, default=5, help="TPE seeds 0..N-1")
    p.add_argument("--within", type=float, default=0.03)
    p.set_defaults(func=cmd_efficiency)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _search_options(p: argparse.ArgumentParser, mode: str) -> None:
    p.add_argument("--mode", choices=("tpe", "exhaustive"), default=mode)
    p.add_argument("--trials", type=_positive, default=30,
                   help="trials per study (tpe; default 30)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--storage", default=None,
                   help="Optuna storage URL or journal file (default: "
                        "<out>/<gpu>/tuning/optuna.journal)")
    p.add_argument("--out", type=Path, default=Path("reports"), help="reports folder")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds; stop between configurations once spent (resume by re-running)")
    p.add_argument("--reps", type=int, default=20,
                   help="timed batches per configuration (median and spread over them)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="parallel static checks and compilations")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def cmd_tune(args: argparse.Namespace) -> int:
    from pycuda_heads.records import parse_dims
    template = parse_dims(args.template) if args.template else None
    return _run(args, [(args.kernel, parse_dims(args.shape), template)])


def cmd_sweep(args: argparse.Namespace) -> int:
    from pycuda_heads.catalog import catalog
    tasks = catalog().tasks()
    kernels = args.kernels.split(",") if args.kernels else [s.id for s in catalog()]
    unknown = sorted(set(kernels) - {s.id for s in catalog()})
    if unknown:
        print(f"unknown kernels {unknown}; the suite has {sorted(catalog().specs)}",
              file=sys.stderr)
        return 2
    return _run(args, [(s.id, shape, template) for s, template, shape in tasks
                       if s.id in kernels])


def _run(args: argparse.Namespace, specs: list) -> int:
    import optuna

    from pycuda_heads.catalog import catalog
    from pycuda_heads.core.device import GpuUnavailableError

    from .constraints import Feasibility, spec_static
    from .objective import GpuContext, GpuEvaluator
    from .progress import Budget, Progress
    from .session import EvaluatorBroken
    from .spaces import TuningTask
    from .sweep import run_sweep

    started = time.time()
    try:
        gpu = GpuContext.current()
    except GpuUnavailableError as exc:
        print(f"tuning needs a GPU: {exc}", file=sys.stderr)
        return 2
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        tasks = [TuningTask.from_spec(catalog()[k], shape, gpu.name, gpu.slug, template)
                 for k, shape, template in specs]
    except (KeyError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        outcomes = run_sweep(
            tasks,
            evaluator_for=lambda t: GpuEvaluator(t, reps=args.reps, warmup=args.warmup),
            feasibility_for=lambda t: Feasibility(t, spec_static(t, gpu.arch),
                                                  gpu.max_shared_bytes),
            out=args.out, mode=args.mode, trials=args.trials, seed=args.seed,
            storage=args.storage, budget=Budget(args.time_budget),
            progress=Progress(enabled=not args.no_progress),
            warm=lambda items: gpu.precompile(items, args.jobs), workers=args.jobs,
            command=shlex.join(["pycuda-heads", *sys.argv[1:]]))
    except EvaluatorBroken as exc:
        print(f"stopped: {exc}\nthat configuration is recorded as failed; re-run the same "
              "command to resume", file=sys.stderr)
        return 4
    for o in outcomes:
        best = "no validated configuration" if o.best is None else \
            f"{o.best.time_us:.2f} us {o.best.params}"
        default = "-" if o.default is None or o.default.time_us is None else \
            f"{o.default.time_us:.2f} us"
        print(f"{o.task.label():40s} best {best} (default {default})"
              + (" [unfinished]" if o.stopped else ""))
    status = 0 if len(outcomes) == len(tasks) and not any(o.stopped for o in outcomes) else 3
    records.log_phase(Path(args.out) / gpu.slug, args.command, started, status)
    return status


def cmd_export(args: argparse.Namespace) -> int:
    from pycuda_heads.core.tuned import TABLE_DIR

    from .export import export, slugs_with_data
    slugs = [args.slug] if args.slug else slugs_with_data(args.reports)
    if not slugs:
        print(f"no tuning data under {args.reports}", file=sys.stderr)
        return 2
    for slug in slugs:
        started = time.time()
        try:
            path = export(args.reports, slug, args.out or TABLE_DIR)
        except (FileNotFoundError, ValueError) as exc:
            print(exc, file=sys.stderr)
            return 2
        records.log_phase(Path(args.reports) / slug, "export", started, 0)
        print(f"wrote {path}")
    return 0


def cmd_efficiency(args: argparse.Namespace) -> int:
    import optuna

    from .efficiency import run_efficiency
    from .export import slugs_with_data
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    slugs = [args.slug] if args.slug else slugs_with_data(args.reports)
    if not slugs:
        print(f"no tuning data under {args.reports}", file=sys.stderr)
        return 2
    for slug in slugs:
        print(f"wrote {run_efficiency(args.reports, slug, range(args.seeds), args.within)}")
    return 0
