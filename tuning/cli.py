"""The tuning subcommands of ``pycuda-heads``: tune, sweep, export, prune, efficiency."""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Callable

from pycuda_heads import records

from . import DEFAULT_SAMPLER

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

    p = sub.add_parser("export", help="best validated configurations -> the GPU's tuned table")
    _results_options(p)
    p.add_argument("--install", action="store_true",
                   help="write the table into the installed package (pycuda_heads/tuned, or "
                        "$PYCUDA_HEADS_TUNED_DIR), where the ops read it (default: only into "
                        "the results folder, OUT/<gpu>/<gpu>.json)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("prune", help="cut the journal down to the studies behind the "
                                     "tuned tables' entries")
    _results_options(p)
    p.set_defaults(func=cmd_prune)

    p = sub.add_parser("efficiency", help="trials TPE needs to come within 3%% of the "
                                          "exhaustive best (CPU replay of the caches)")
    _results_options(p)
    p.add_argument("--seeds", type=_positive, default=5, help="TPE seeds 0..N-1")
    p.add_argument("--within", type=_fraction, default=0.03,
                   help="relative distance to the exhaustive best, in (0, 1)")
    p.add_argument("--replace", action="store_true",
                   help="replay the tasks efficiency.json and quality.json already hold too, "
                        "replacing their entries (default: keep them and add only the missing "
                        "ones); with --measure, also start afresh a reference record of other "
                        "kernel sources")
    p.add_argument("--measure", action="store_true",
                   help="on this GPU: time the reference search of each --task and the "
                        "samplers' searches (resumable: re-run to go on), then draw their curves "
                        "into quality.json (docs/tuning.md)")
    p.add_argument("--task", dest="tasks", action="append", default=[],
                   metavar="KERNEL:SHAPE[:TEMPLATE]",
                   help="a task to measure or replay, e.g. "
                        "'pool.forward:B=512,K=64:N_HORIZONS=32' (repeatable; default: the four "
                        "tasks of docs/tuning.md)")
    p.add_argument("--samplers", default=None,
                   help="comma-separated samplers whose searches are measured (default "
                        "tpe,random) or replayed (default: all)")
    p.add_argument("--chain-trials", type=_positive, default=None,
                   help="with --measure: trials of each sampler's search (default: the largest "
                        "budget a curve draws, 100; fewer measures the smaller budgets first, "
                        "and a later run with more goes on from there)")
    p.add_argument("--reference-trials", type=_positive, default=300,
                   help="trials of the mixed reference search (default 300; a space with no "
                        "more points is timed whole)")
    p.add_argument("--adopt", action="store_true",
                   help="with --measure: where the op's point is more than --within slower "
                        "than the reference best beyond noise, put the best into the task's "
                        "tuning cache and compare it with the default there (export ships it)")
    p.add_argument("--time-budget", type=_seconds, default=None,
                   help="with --measure: seconds; stop between configurations once spent")
    p.add_argument("--reps", type=_positive, default=20, help="with --measure: timed batches")
    p.add_argument("--warmup", type=_non_negative, default=3,
                   help="with --measure: untimed batches")
    p.add_argument("--jobs", type=_positive, default=os.cpu_count() or 1,
                   help="with --measure: parallel static checks and compilations")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_efficiency)


def _results_options(p: argparse.ArgumentParser) -> None:
    """A command reading the results folder: ``--out`` (must exist) and ``--gpu``."""
    p.add_argument("--out", type=Path, default=Path("reports"),
                   help="results folder, one sub-folder per GPU (default: reports)")
    p.add_argument("--gpu", default=None, help="GPU slug (default: every GPU with data)")
    p.set_defaults(reads_out=True)


_positive = records.int_at_least(1)
_non_negative = records.int_at_least(0)


def _seed(text: str) -> int:
    value = _non_negative(text)
    if value >= 2 ** 32:  # NumPy's generators behind the samplers take no more
        raise argparse.ArgumentTypeError(f"expected a seed below 2**32, got {value}")
    return value


def _number(low: float, high: float, what: str) -> Callable[[str], float]:
    """An argument type: a number strictly between ``low`` and ``high`` (never nan: a nan
    budget would never stop, a zero one never start)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not low < value < high:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value
    return parse


_seconds = _number(0, math.inf, "seconds > 0")
_fraction = _number(0, 1, "a fraction in (0, 1)")


def _point(text: str) -> dict[str, int]:
    try:
        point = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}: {exc}") from None
    if not isinstance(point, dict) or not point:
        raise argparse.ArgumentTypeError(f"expected a JSON object of knobs, got {text!r}")
    return point


def _search_options(p: argparse.ArgumentParser, mode: str) -> None:
    p.add_argument("--mode", choices=("tpe", "exhaustive"), default=mode)
    p.add_argument("--trials", type=_positive, default=30,
                   help="trials per study (tpe; default 30)")
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--sampler", default=DEFAULT_SAMPLER,
                   help=f"how TPE mode proposes points (default {DEFAULT_SAMPLER}; "
                        "docs/tuning.md lists and compares them)")
    p.add_argument("--try", dest="tries", type=_point, action="append", default=[],
                   metavar="JSON",
                   help="a partial point to try first, e.g. '{\"STAGES\": 3}' (repeatable): "
                        "completed from the default in every study whose kernel has its knobs "
                        "and where it is valid; tries count toward --trials")
    p.add_argument("--worker-seed", type=_seed, default=None,
                   help="sampler seed of this worker when several share one study (default: "
                        "--seed); give each worker its own")
    p.add_argument("--workers", type=_positive, default=1,
                   help="start N worker processes on one study, worker i with sampler seed "
                        "--seed + i on GPU i (CUDA_VISIBLE_DEVICES)")
    p.add_argument("--storage", default=None,
                   help="journal file, sqlite:///FILE or postgresql://USER@HOST/DB shared by "
                        "workers on several machines (default: "
                        "<out>/<gpu>/tuning/optuna.journal)")
    p.add_argument("--out", type=Path, default=Path("reports"), help="reports folder")
    p.add_argument("--time-budget", type=_seconds, default=None,
                   help="seconds; stop between configurations once spent (resume by re-running)")
    p.add_argument("--reps", type=_positive, default=20,
                   help="timed batches per configuration (median and spread over them)")
    p.add_argument("--warmup", type=_non_negative, default=3,
                   help="untimed batches before the timed ones")
    p.add_argument("--jobs", type=_positive, default=os.cpu_count() or 1,
                   help="parallel static checks and compilations")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress: no bar on a terminal, no line per trial in a log")


def cmd_tune(args: argparse.Namespace) -> int:
    try:
        task = task_args(args.kernel, args.shape, args.template)
    except ValueError as exc:
        print(f"pycuda-heads tune: {exc}", file=sys.stderr)
        return 2
    return _run(args, [task])


_INT32_MAX = 2 ** 31 - 1


def task_args(kernel: str, shape: str, template: str | None
              ) -> tuple[str, dict[str, int], dict[str, int] | None]:
    """(kernel, shape, template) from the command line; a ValueError in one line naming the
    argument when one is malformed or does not fit the kernel."""
    from pycuda_heads.catalog import catalog
    from pycuda_heads.records import parse_dims
    if kernel not in catalog():
        raise ValueError(f"--kernel {kernel!r} is unknown; kernels: "
                         f"{', '.join(sorted(catalog().specs))}")
    spec = catalog()[kernel]
    axes = set(spec.suite[0])
    dims = {}
    for option, text, allowed, need_all in (("--shape", shape, axes, True),
                                            ("--template", template, set(spec.template_keys),
                                             False)):
        if text is None:
            continue
        try:
            dims[option] = parse_dims(text)
        except ValueError as exc:
            raise ValueError(f"{option}: {exc}") from None
        names = [part.partition("=")[0].strip() for part in text.split(",")]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:  # parse_dims keeps the last value silently
            raise ValueError(f"{option} {text!r}: {', '.join(repeated)} given more than once")
        given = set(dims[option])
        if not allowed:  # only --template: every kernel has shape axes
            raise ValueError(f"{option} {text!r}: {kernel} takes no template constants")
        if given - allowed or (need_all and given != allowed):
            raise ValueError(f"{option} {text!r}: {kernel} takes {', '.join(sorted(allowed))}"
                             + ("" if need_all else " (the rest from the suite)"))
        bad = [f"{k}={v}" for k, v in dims[option].items() if v < 1]
        if bad:
            raise ValueError(f"{option} {text!r}: {', '.join(bad)} must be >= 1")
        big = [f"{k}={v}" for k, v in dims[option].items() if v > _INT32_MAX]
        if big:  # the kernels take sizes as C int
            raise ValueError(f"{option} {text!r}: {', '.join(big)} exceeds {_INT32_MAX}")
    return kernel, dims["--shape"], dims.get("--template")


def cmd_sweep(args: argparse.Namespace) -> int:
    from pycuda_heads.catalog import catalog
    tasks = catalog().tasks()
    kernels = [k.strip() for k in args.kernels.split(",")] if args.kernels is not None \
        else [s.id for s in catalog()]
    if not all(kernels):  # '' would otherwise select nothing, or everything
        print(f"pycuda-heads sweep: --kernels {args.kernels!r} names an empty kernel; give "
              "comma-separated kernel ids, or leave --kernels out for all", file=sys.stderr)
        return 2
    unknown = sorted(set(kernels) - {s.id for s in catalog()})
    if unknown:
        print(f"pycuda-heads sweep: --kernels {args.kernels!r}: unknown kernels "
              f"{', '.join(unknown)}; the suite has {', '.join(sorted(catalog().specs))}",
              file=sys.stderr)
        return 2
    return _run(args, [(s.id, shape, template) for s, template, shape in tasks
                       if s.id in kernels])


def _command() -> str:
    return shlex.join(["pycuda-heads", *sys.argv[1:]])


def _spawn_workers(args: argparse.Namespace) -> int:
    """Run this command as ``args.workers`` processes on one study, one GPU each."""
    import subprocess

    from .sweep import WorkerRun
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    if gpus[0] and args.workers > len(gpus):  # a worker outside the set would share a GPU
        print(f"pycuda-heads {args.command}: --workers {args.workers} needs as many GPUs, "
              f"CUDA_VISIBLE_DEVICES names {len(gpus)}", file=sys.stderr)
        return 2
    run = WorkerRun.new(_command())
    procs = []
    for i in range(args.workers):
        env = {**os.environ, **run.spawn_env(i, args.workers),
               "CUDA_VISIBLE_DEVICES": gpus[i] if gpus[0] else str(i)}
        procs.append(subprocess.Popen([sys.executable, "-m", "pycuda_heads.cli", *sys.argv[1:],
                                       "--workers", "1", "--worker-seed", str(args.seed + i)],
                                      env=env))
    return max(p.wait() for p in procs)


def _run(args: argparse.Namespace, specs: list) -> int:
    import optuna

    from pycuda_heads.catalog import catalog
    from pycuda_heads.core.device import GpuUnavailableError

    from .constraints import Feasibility, spec_static
    from .locks import Locked
    from .objective import GpuContext, GpuEvaluator
    from .progress import Budget, Progress
    from .samplers import check_sampler
    from .session import EvaluatorBroken
    from .spaces import TuningTask
    from .storage import check_storage
    from .sweep import WorkerRun, run_sweep

    if args.workers > 1:
        return _spawn_workers(args)
    started = time.time()
    try:  # everything the user typed is checked before any GPU work
        check_storage(args.storage)
        check_sampler(args.sampler)
        _writable(Path(args.out))
        _check_tries(args.tries, [k for k, _, _ in specs])
    except (ValueError, OSError) as exc:
        print(f"pycuda-heads {args.command}: {exc}", file=sys.stderr)
        return 2
    try:
        gpu = GpuContext.current()
    except GpuUnavailableError as exc:
        print(f"tuning needs a GPU: {exc}", file=sys.stderr)
        return 2
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        tasks = [TuningTask.from_spec(catalog()[k], shape, gpu.name, gpu.slug, template,
                                      gpu.max_shared_bytes, args.tries)
                 for k, shape, template in specs]
    except (KeyError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        _check_caches(Path(args.out), tasks)
    except ValueError as exc:
        print(f"pycuda-heads {args.command}: {exc}", file=sys.stderr)
        return 2
    try:
        outcomes = run_sweep(
            tasks,
            evaluator_for=lambda t: GpuEvaluator(t, reps=args.reps, warmup=args.warmup),
            feasibility_for=lambda t: Feasibility(t, spec_static(t, gpu.arch)),
            out=args.out, mode=args.mode, trials=args.trials,
            seed=args.seed if args.worker_seed is None else args.worker_seed,
            storage=args.storage, budget=Budget(args.time_budget),
            progress=Progress(enabled=not args.no_progress),
            warm=lambda items: gpu.precompile(items, args.jobs), workers=args.jobs,
            run=WorkerRun.current(_command()), sampler=args.sampler)
    except EvaluatorBroken as exc:
        print(f"stopped: {exc}\nthat configuration is recorded as failed; re-run the same "
              "command to resume", file=sys.stderr)
        return 4
    except (ValueError, OSError, Locked) as exc:  # a corrupt cache or journal names its file
        print(f"pycuda-heads {args.command}: {exc}", file=sys.stderr)
        return 2
    for o in outcomes:
        best = "no validated configuration" if o.best is None else \
            f"{o.best.time_us:.2f} us {o.best.params}"
        default = "-" if o.default is None or o.default.time_us is None else \
            f"{o.default.time_us:.2f} us"
        print(f"{o.task.label():40s} best {best} (default {default})"
              + (" [unfinished]" if o.stopped else ""))
    status = 0 if len(outcomes) == len(tasks) and not any(o.stopped for o in outcomes) else 3
    records.log_phase(Path(args.out) / gpu.slug, args.command, started, status,
                      "kernels " + args.kernels if getattr(args, "kernels", None) else "")
    return status


def _check_caches(out: Path, tasks: list) -> None:
    """ValueError naming the cache file of a task that the tuner cannot take in: loaded here
    as the tuner will, since an error in the middle of a sweep would name no file."""
    from .cache import TuningCache
    from .storage import cache_path, tuning_dir
    for task in tasks:
        path = cache_path(tuning_dir(out, task.slug), task)
        if not path.is_file():
            continue
        try:
            TuningCache.load(task, path)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"tuning cache {path} is malformed ({type(exc).__name__}: {exc}); "
                             "delete or restore it") from None


def _check_tries(tries: list[dict], kernels: list[str]) -> None:
    """ValueError for a try that no kernel of the run can take: a misspelt knob, or a value
    its space lacks."""
    from pycuda_heads.catalog import catalog

    from .spaces import takes
    names = list(dict.fromkeys(kernels))
    for partial in tries:
        spaces = [s for s in (catalog()[k].space for k in names) if takes(s, partial)]
        if not spaces:
            raise ValueError(f"--try {json.dumps(partial)}: no kernel of this run has all of "
                             f"its knobs ({', '.join(names)})")
        for space in spaces:
            space.complete(partial)  # names a value the space lacks


def _writable(out: Path) -> None:
    """OSError naming ``out`` when results cannot be written there."""
    out.mkdir(parents=True, exist_ok=True)
    if not os.access(out, os.W_OK | os.X_OK):
        raise PermissionError(f"reports folder {out} is not writable")


def _gpus(args: argparse.Namespace, known: list[str]) -> list[str]:
    """The GPUs a command reading the results folder works on: ``--gpu``, else every one of
    ``known`` (those with tuning data); [] after one line saying there is none."""
    if not (args.gpu or known):
        print(f"pycuda-heads {args.command}: no tuning data under {args.out}", file=sys.stderr)
        return []
    return [args.gpu] if args.gpu else known


def cmd_export(args: argparse.Namespace) -> int:
    from pycuda_heads.core.tuned import table_dir

    from .export import export, slugs_with_data
    slugs = _gpus(args, slugs_with_data(args.out))
    if not slugs:
        return 2
    for slug in slugs:  # no phase logged: export writes the table and no data file it reads
        try:
            paths = [export(args.out, slug, args.out / slug)]
            if args.install:  # the same bytes
                paths.append(table_dir() / paths[0].name)
                records.write_text(paths[1], paths[0].read_text())
        except (OSError, ValueError) as exc:  # FileNotFoundError: no data for the sources
            print(f"pycuda-heads export: {exc}", file=sys.stderr)
            return 2
        print("wrote " + " and ".join(str(p) for p in paths))
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    from pycuda_heads.core.tuned import table_dir

    from .export import slugs_with_data
    from .prune import prune_journal, study_names
    from .storage import tuning_dir
    slugs = _gpus(args, slugs_with_data(args.out))
    if not slugs:
        return 2
    for slug in slugs:
        journal = tuning_dir(args.out, slug) / records.JOURNAL
        if not journal.is_file():
            print(f"pycuda-heads prune: no journal at {journal}", file=sys.stderr)
            return 2
        # the installed table's entries and the results folder's (exported, maybe not
        # installed yet)
        tables = [p for p in (table_dir() / f"{slug}.json", args.out / slug / f"{slug}.json")
                  if p.is_file()]
        if not tables:
            print(f"pycuda-heads prune: no tuned table of {slug} (installed or in {args.out}); "
                  "nothing tells which studies to keep", file=sys.stderr)
            return 2
        try:
            keep = set().union(*(study_names(records.read_json(p, "tuned table"))
                                 for p in tables))
            kept, dropped = prune_journal(journal, keep)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            print(f"pycuda-heads prune: {slug}: {exc}", file=sys.stderr)
            return 2
        print(f"{journal}: kept {kept} studies, dropped {dropped}")
    return 0


def cmd_efficiency(args: argparse.Namespace) -> int:
    import optuna

    from .efficiency import run_efficiency
    from .export import slugs_with_data
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        specs = [_task_arg(text) for text in args.tasks]
        samplers = _samplers(args.samplers)
        if args.adopt and not args.measure:
            raise ValueError("--adopt needs --measure: it times on this GPU")
        if args.measure and args.gpu is not None:
            raise ValueError("--gpu names stored data to replay; --measure times on this GPU")
        if args.chain_trials is not None:
            from .quality import BUDGETS
            if not args.measure:
                raise ValueError("--chain-trials needs --measure: it sets what is timed")
            if args.chain_trials > max(BUDGETS):  # no curve reaches further
                raise ValueError(f"--chain-trials {args.chain_trials}: at most {max(BUDGETS)}, "
                                 "the largest budget a curve draws")
    except ValueError as exc:
        print(f"pycuda-heads efficiency: {exc}", file=sys.stderr)
        return 2
    if args.measure:
        return _measure(args, specs, samplers or ["tpe", "random"])
    known = slugs_with_data(args.out)
    if args.gpu is not None and args.gpu not in known:  # named even where no GPU has data
        print(f"pycuda-heads efficiency: --gpu {args.gpu!r} has no tuning data under "
              f"{args.out}; GPUs with data: {', '.join(known) or 'none'}", file=sys.stderr)
        return 2
    slugs = _gpus(args, known)
    if not slugs:
        return 2
    from .progress import Progress
    from .quality import replay_all
    for slug in slugs:
        try:
            path = run_efficiency(args.out, slug, range(args.seeds), args.within,
                                  replace=args.replace)
            print(f"wrote {path}")
            path = replay_all(args.out, slug, specs, samplers, range(args.seeds), args.within,
                              replace=args.replace,
                              progress=Progress(enabled=not args.no_progress))
        except ValueError as exc:  # a corrupt cache names its file, as in export
            print(exc, file=sys.stderr)
            return 2
        if path is not None:
            print(f"wrote {path}")
    return 0


def _task_arg(text: str) -> tuple[str, dict[str, int], dict[str, int] | None]:
    """A --task: KERNEL:SHAPE[:TEMPLATE]."""
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"--task {text!r}: expected KERNEL:SHAPE[:TEMPLATE], e.g. "
                         "pool.forward:B=4096,K=256")
    return task_args(parts[0], parts[1], parts[2] if len(parts) == 3 else None)


def _samplers(text: str | None) -> list[str] | None:
    from .samplers import check_sampler
    if text is None:
        return None
    names = [n.strip() for n in text.split(",")]
    for name in names:
        check_sampler(name)
    return list(dict.fromkeys(names))


def _measure(args: argparse.Namespace, specs: list, samplers: list[str]) -> int:
    """``efficiency --measure``: the reference measurement of each task on this GPU."""
    from pycuda_heads.catalog import catalog
    from pycuda_heads.core.device import GpuUnavailableError

    from . import constraints
    from .constraints import Feasibility, spec_static
    from .objective import GpuContext, GpuEvaluator
    from .progress import Budget, Progress
    from .quality import (TASKS, Record, adopt, curves, measure, reference_path, replaceable,
                          stale_record, write_quality)
    from .session import EvaluatorBroken
    from .spaces import TuningTask
    started = time.time()
    try:
        specs = specs or [task_args(*t) for t in TASKS]
        _writable(Path(args.out))
        gpu = GpuContext.current()
    except (ValueError, OSError) as exc:
        print(f"pycuda-heads efficiency: {exc}", file=sys.stderr)
        return 2
    except GpuUnavailableError as exc:
        print(f"efficiency --measure needs a GPU: {exc}", file=sys.stderr)
        return 2
    tasks = [TuningTask.from_spec(catalog()[k], shape, gpu.name, gpu.slug, template,
                                  gpu.max_shared_bytes) for k, shape, template in specs]
    for task in tasks:
        path = reference_path(args.out, task)
        if stale_record(path, task) and not args.replace:
            print(f"pycuda-heads efficiency: {path} was measured for other kernel sources; "
                  "--replace starts it afresh", file=sys.stderr)
            return 2
    budget, progress = Budget(args.time_budget), Progress(enabled=not args.no_progress)
    entries, unfinished = [], []
    for task in tasks:
        if budget.expired():
            unfinished.append(task.label())
            continue
        feas = Feasibility(task, spec_static(task, gpu.arch))

        def warm(points: list, task: TuningTask = task, feas: Feasibility = feas) -> None:
            constraints.warm([(feas, p) for p in points], args.jobs)
            gpu.precompile([(task, p) for p in points if feas(p) is None], args.jobs)
        evaluator = GpuEvaluator(task, reps=args.reps, warmup=args.warmup)
        try:
            record = Record.load(task, reference_path(args.out, task))
            done = measure(task, evaluator, feas, record, samplers=samplers,
                           seeds=range(args.seeds), reference_trials=args.reference_trials,
                           chain_trials=args.chain_trials,
                           budget=budget, progress=progress, warm=warm)
        except EvaluatorBroken as exc:
            print(f"stopped: {exc}\nthat configuration is recorded as failed; re-run the same "
                  "command to resume", file=sys.stderr)
            return 4
        except ValueError as exc:  # a record that no longer replays names itself
            print(f"pycuda-heads efficiency: {exc}", file=sys.stderr)
            return 2
        if not done:  # its curves are drawn once it is (or on the CPU: efficiency --replace)
            unfinished.append(task.label())
            continue
        if args.adopt and replaceable(record.verdict, args.within):
            print(f"{task.label()}: {adopt(task, evaluator, record, args.out)}")
        entry = curves(task, record, samplers, range(args.seeds), args.within, progress)
        if entry is not None:
            entries.append(entry)
            print(f"{task.label():40s} reference {entry['reference']['time_us']:.2f} us "
                  f"from {entry['n_timed']} timed; the op's point at "
                  f"{entry['running']['percent']}%")
    if entries:
        print(f"wrote {write_quality(args.out, gpu.slug, entries, replace_all=False)}")
    status = 3 if unfinished else 0
    if unfinished:
        print(f"unfinished: {', '.join(unfinished)}; re-run the same command to resume")
    records.log_phase(Path(args.out) / gpu.slug, "efficiency --measure", started, status,
                      ", ".join(t.label() for t in tasks))
    return status
