"""``pycuda-heads bench``: every op x suite shape x pass against what a user would otherwise run.

Providers, measured side by side in one process on one GPU:
  tuned          the library with ``launch=None`` (the tuned table, else the default)
  default        the library without its tuned table: every kernel's default launch parameters
                 (the nearest valid point where a shape needs another)
                 Both run an op as the library's compositions run it: the FRD head (``frdhead``)
                 at B <= ``step.SMALL_BATCH`` is ``FrdHeadSmall``'s kernels (``step.frd_head``, as
                 in ``TrainStep`` and ``pycuda_heads.torch.FrdHead``); the row's note says so
  torch_eager    the same math in PyTorch ops (each kernel's declared peer), when torch is
                 importable; without torch no peer rows are written and the report says so
  torch_compile  the same functions through ``torch.compile(dynamic=False)``, compiled per shape
  floor          bytes that must move / device copy bandwidth measured in this run
  compute_floor  a pass's declared matrix products (``KernelSpec.products``) in 3xTF32, three
                 TF32 products each, at cuBLAS's TF32 rate measured in this run (with torch)
  separate       a fused pass (``KernelSpec.fuses``) run unfused (``Catalog.unfused``): the
                 tuned kernels its fused kernels stand for, one after the other
  empty_kernel   one empty kernel launch (once per run), the yardstick of the small shapes

GPU time comes from ``timing.gpu_time_us``: batches of calls queued behind a spin kernel, so the
CUDA events time the GPU's work, not the Python that enqueues it; the Python cost of a call is
timed on the host meanwhile (``python_call_us``), beside the host cost of the same kernel
launches made bare (``bare_launch_us``). Rows go to ``<out>/<gpu-slug>/bench.csv``.
A measurement whose p80/p20 spread exceeds ``records.NOISY_SPREAD`` is taken again; a second
noisy one is kept and flagged in the ``noisy`` column.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import importlib
import json
import logging
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from .. import records, step
from ..catalog import SUITE_TEMPLATE, BenchCase, Catalog, catalog
from ..core import device
from ..core.compile import recorded_launches
from ..core.spec import KernelSpec
from ..progress import Steps
from . import timing

log = logging.getLogger("pycuda_heads.bench")

LIBRARY = ("tuned", "default")
STEP = records.STEP_OP  # the composed head step (``step_bench``), beside the catalog's families
TORCH_TRAIN = records.TORCH_TRAIN_OP  # PyTorch training steps (``torch_train``)
TRAIN_STEP = records.TRAIN_STEP_OP  # the whole head's training step (``train_bench``)
#: the bench's ops that are no catalog family
COMPOSED = (STEP, TORCH_TRAIN, TRAIN_STEP)
PEERS = ("torch_eager", "torch_compile")
COLUMNS = ("date", "commit", "gpu", "driver_version", "cuda_version", "library_version",
           "torch_version", "op", "shape", "pass", "provider", "median_us", "p20_us", "p80_us",
           "reps", "python_call_us", "bare_launch_us", "floor_bytes", "copy_bandwidth_GBps",
           "l2_cache_bytes", "max_rel_err", "noisy", "config", "error", "note")


def library_op(specs: Sequence[KernelSpec], provider: str,
               template: Mapping[str, int] = SUITE_TEMPLATE) -> Any:
    """The library op object of a family: with the tuned table, or without it (every kernel
    at its default, or the nearest valid point where the default cannot run a shape, chosen
    per shape as the op does on a GPU with no table)."""
    cls = specs[0].op
    op = cls(**cls.constructor_kwargs(specs[0].template(template)))
    op.use_table = provider == "tuned"
    return op


class CudaHarness:
    """The GPU side of the bench (PyCUDA, primary context shared with torch, default stream)."""

    torch_device = "cuda"

    def __init__(self) -> None:
        self._drv = device.cuda()
        self.slug = device.gpu_slug()

    def env(self) -> dict[str, Any]:
        v = self._drv.get_driver_version()
        drv = self._drv
        with device.thread_context():
            l2 = drv.Context.get_device().get_attribute(drv.device_attribute.L2_CACHE_SIZE)
        return {"gpu": device.gpu_name(), "driver_version": _driver_version(),
                "cuda_version": f"{v // 1000}.{v % 1000 // 10}", "l2_cache_bytes": l2}

    def upload(self, x: Mapping[str, np.ndarray]) -> dict[str, Any]:
        import pycuda.gpuarray as gpuarray
        return {name: gpuarray.to_gpu(a) for name, a in x.items()}

    def library_op(self, specs: Sequence[KernelSpec], provider: str,
                   template: Mapping[str, int] = SUITE_TEMPLATE) -> Any:
        return library_op(specs, provider, template)

    def sync(self) -> None:
        self._drv.Context.synchronize()

    def empty_launch(self) -> Callable[[], None]:
        return timing.empty_launch

    def tf32_tflops(self, peers: Any, reps: int) -> float:
        """cuBLAS's TF32 rate on this GPU in TFLOP/s: a square product through torch."""
        fn, flops = peers.tf32_product(self.torch_device)
        return flops / (self.time(fn, reps)["median_us"] * 1e6)

    def copy_bandwidth_gbps(self, nbytes: int = 1 << 30, reps: int = 20) -> float:
        """Device-to-device copy of ``nbytes``, counting bytes read plus bytes written."""
        drv = self._drv
        src, dst = drv.mem_alloc(nbytes), drv.mem_alloc(nbytes)
        start, stop = drv.Event(), drv.Event()
        try:
            drv.memset_d32(src, 0x3F800000, nbytes // 4)  # 1.0f, not zeros
            times = []
            for i in range(reps + 3):
                start.record()
                drv.memcpy_dtod(dst, src, nbytes)
                stop.record()
                stop.synchronize()
                if i >= 3:
                    times.append(stop.time_since(start) * 1e-3)
            return 2 * nbytes / float(np.median(times)) / 1e9
        finally:
            src.free()
            dst.free()

    def time(self, fn: Callable[[], Any], reps: int) -> dict[str, float]:
        """GPU time (median, p20, p80) and Python call cost of ``fn``, timed once warm:
        ``gpu_time_us`` first calls it ``warmup`` times (compile, allocate, fill the caches)
        and synchronises."""
        return timing.gpu_time_us(fn, reps=reps)


def _driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.strip().splitlines()[0] if out.strip() else "unknown"


def append_rows(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Append ``rows`` to the CSV at ``path``; a file with other columns is rewritten with
    these (its old rows keep the columns they share)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    old: list[dict[str, str]] | None = None
    if path.is_file() and path.stat().st_size:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            if tuple(reader.fieldnames or ()) != COLUMNS:
                old = list(reader)
    fresh = not path.is_file() or not path.stat().st_size or old is not None
    with path.open("w" if fresh else "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        if fresh:
            writer.writeheader()
        for row in old or ():
            writer.writerow({k: row.get(k, "") for k in COLUMNS})
        for row in rows:
            writer.writerow({k: _cell(row.get(k)) for k in COLUMNS})


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _load_peers(torch_device: str) -> tuple[Any, str, str]:
    """(peers_torch module or None, torch version or 'absent', why torch is unusable or '')."""
    try:
        peers = importlib.import_module(".peers_torch", __package__)
        peers.prepare(torch_device)
    except Exception as exc:  # a missing or broken torch means no peer rows, never a crash
        return None, "absent", f"torch unusable: {type(exc).__name__}: {exc}"
    return peers, peers.torch.__version__, ""


class Bench:
    """One run: measures op x shape x pass x provider and appends the rows per shape."""

    def __init__(self, harness: Any, ops: Sequence[str], quick: bool, out_root: Path,
                 commit: str, cat: Catalog | None = None) -> None:
        self.harness, self.quick = harness, quick
        self.catalog = cat or catalog()
        families = self.catalog.families()
        unknown = sorted(set(ops) - set(families) - set(COMPOSED))
        if unknown:
            raise ValueError(f"unknown ops {unknown}; expected some of {sorted(families)}")
        self.ops = tuple(ops)
        self.reps = 10 if quick else 30
        self.path = Path(out_root) / harness.slug / records.BENCH_CSV
        self.peers, torch_version, self.torch_error = _load_peers(harness.torch_device)
        self.base = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                         timespec="seconds"),
                     "commit": commit, "library_version": records.VERSION,
                     "torch_version": torch_version, **harness.env()}
        self._ops: dict[tuple[str, str], Any] = {}
        self.bandwidth = float("nan")  # GB/s, measured first thing in run()
        self.tf32_tflops: float | None = None  # measured in run() where a case has products

    def plan(self) -> list[tuple[str, dict[str, int], list[BenchCase]]]:
        """(op, shape, its cases) in run order; --quick keeps each op's smallest and largest."""
        by_shape: dict[tuple[str, str], list[BenchCase]] = {}
        for case in self.catalog.bench_cases():
            if case.op in self.ops:
                by_shape.setdefault((case.op, records.dims_label(case.label_dims)),
                                    []).append(case)
        out = []
        for op in self.ops:
            if op in COMPOSED:
                continue
            shapes = [(k, v) for k, v in by_shape.items() if k[0] == op]
            if self.quick and len(shapes) > 2:
                shapes = [shapes[0], shapes[-1]]
            out += [(op, dict(cases[0].shape), cases) for _, cases in shapes]
        return out

    def providers(self) -> tuple[str, ...]:
        return LIBRARY + (PEERS if self.peers is not None else ())

    def run(self) -> Path:
        if self.torch_error:
            log.warning("%s: the torch peers are not measured", self.torch_error)
        self.bandwidth = self.harness.copy_bandwidth_gbps()
        log.info("device copy bandwidth %.0f GB/s", self.bandwidth)
        plan = self.plan()
        if self.peers is not None and any(c.flops() for _, _, cases in plan for c in cases):
            self.tf32_tflops = self.harness.tf32_tflops(self.peers, self.reps)
            log.info("cuBLAS TF32 rate %.0f TFLOP/s", self.tf32_tflops)
        from . import torch_train
        train = TORCH_TRAIN in self.ops and self.peers is not None
        if TORCH_TRAIN in self.ops and not train:
            log.warning("torch_train: not measured, torch is not importable here")
        total = (1 + sum(len(self.providers()) + bool(c.separate)
                         for _, _, cases in plan for c in cases)
                 + (STEP in self.ops) + (TRAIN_STEP in self.ops)
                 + train * sum(map(len, torch_train.SHAPES.values())))
        torch = self.peers.torch if self.peers is not None else None
        with Steps(total, "bench", "case") as steps:
            empty = self._measure(self.harness.empty_launch(), "empty kernel")
            empty_row = self._row(records.EMPTY_KERNEL, "-", "-", records.EMPTY_KERNEL, empty)
            append_rows(self.path, [empty_row])
            steps.step(records.EMPTY_KERNEL)
            for op, shape, cases in plan:
                append_rows(self.path, self._shape_rows(op, shape, cases, steps))
            if STEP in self.ops:
                from . import step_bench
                append_rows(self.path, step_bench.rows(self._row, torch, log.warning))
                steps.step(STEP)
            if TRAIN_STEP in self.ops:
                from . import train_bench
                append_rows(self.path, train_bench.rows(
                    self._row, torch, self.bandwidth, int(self.base.get("l2_cache_bytes") or 0),
                    log.warning, self.reps))
                steps.step(TRAIN_STEP)
            if train:
                for rows in torch_train.rows(self._row, self.peers.torch, log.warning):
                    append_rows(self.path, rows)
                    steps.step(f"{TORCH_TRAIN} {rows[0]['shape']}")
        return self.path

    def _row(self, op: str, shape: str, pass_: str, provider: str,
             result: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
        return {**self.base, "op": op, "shape": shape, "pass": pass_, "provider": provider,
                "copy_bandwidth_GBps": self.bandwidth, **result, **extra}

    def _measure(self, fn: Callable[[], Any], what: str) -> dict[str, Any]:
        try:  # the harness warms fn up itself: a failing call raises here all the same
            t = self.harness.time(fn, self.reps)
            if _spread(t) > records.NOISY_SPREAD:  # once more; the quieter of the two is kept
                again = self.harness.time(fn, self.reps)
                t = min(t, again, key=_spread)
        except Exception as exc:  # one failing provider must not end the run
            log.warning("%s failed: %s", what, timing.error_text(exc))
            return {"error": timing.error_text(exc)}
        out = {k: t[k] for k in ("median_us", "p20_us", "p80_us", "reps", "python_call_us")}
        out["noisy"] = int(_spread(t) > records.NOISY_SPREAD)
        return out

    def _family(self, op: str, case: BenchCase) -> str:
        """The family whose kernels run ``op``'s case in the library's compositions: the FRD
        head's op class at the case's batch (``step.frd_head``), else ``op`` itself."""
        families = self.catalog.families()
        if families[op][0].op is not step.FrdHead:
            return op
        t = case.template
        cls = step.frd_head(case.shape["B"], t["D_IN"], t["FRD_HIDDEN"])
        return next(f for f, specs in families.items() if specs[0].op is cls)

    def _library(self, op: str, provider: str, case: BenchCase) -> Any:
        """The op object of family ``op`` (as the compositions route it) for ``provider``."""
        family = self._family(op, case)
        key = (family, provider, *sorted(case.over.items()))
        if key not in self._ops:
            specs = self.catalog.families()[family]
            self._ops[key] = self.harness.library_op(specs, provider, case.template)
        return self._ops[key]

    def _calls(self, op: str, case: BenchCase, x_lib: Mapping[str, Any],
               x_torch: Mapping[str, Any] | None) -> dict[str, Any]:
        """provider -> callable running the case's kernels, or provider -> error text."""
        calls: dict[str, Any] = {}
        for provider in LIBRARY:
            try:
                obj = self._library(op, provider, case)
                calls[provider] = _chain([_bound(k, obj, x_lib) for k in case.kernels])
            except Exception as exc:
                calls[provider] = timing.error_text(exc)
        if case.separate:
            try:
                calls[records.SEPARATE] = _chain([
                    _bound(k, self._library(k.family, "tuned", case), x_lib)
                    for k in case.separate])
            except Exception as exc:
                calls[records.SEPARATE] = timing.error_text(exc)
        if self.peers is not None:
            for provider in PEERS:
                if any(k.peer is None for k in case.kernels):
                    calls[provider] = "no torch peer is declared for this kernel"
                    continue
                compiled = provider == "torch_compile"
                calls[provider] = _chain([self.peers.call(k, x_torch, compiled)
                                          for k in case.kernels])
        return calls

    def _shape_rows(self, op: str, shape: Mapping[str, int], cases: Sequence[BenchCase],
                    steps: Steps) -> list[dict[str, Any]]:
        label = records.dims_label(cases[0].label_dims)
        x = self.catalog.family_inputs(op, cases[0].template, shape)
        x_lib = self.harness.upload(x)
        x_torch = None
        if self.peers is not None:
            self.peers.reset()  # a fresh compile cache per shape: no recompile limits
            x_torch = self.peers.to_torch(x, self.harness.torch_device)
        rows = []
        for case in cases:
            fb = case.floor_bytes()
            floor_us = fb / (self.bandwidth * 1e3)
            rows.append(self._row(op, label, case.pass_, "floor",
                                  {"median_us": floor_us, "p20_us": floor_us, "p80_us": floor_us},
                                  floor_bytes=fb))
            if self.tf32_tflops and case.flops():
                compute_us = 3 * case.flops() / (self.tf32_tflops * 1e6)
                rows.append(self._row(
                    op, label, case.pass_, records.COMPUTE_FLOOR,
                    {"median_us": compute_us, "p20_us": compute_us, "p80_us": compute_us},
                    note=f"3 x {case.flops() / 1e9:.3g} GFLOP at {self.tf32_tflops:.0f} TFLOP/s"))
            reference, family = None, self._family(op, case)
            for provider, fn in self._calls(op, case, x_lib, x_torch).items():
                extra: dict[str, Any] = {"floor_bytes": fb}
                if isinstance(fn, str):
                    result: dict[str, Any] = {"error": fn}
                else:
                    result = self._measure(fn, f"{op} {label} {case.pass_} {provider}")
                    if provider in (*LIBRARY, records.SEPARATE):
                        separate = provider == records.SEPARATE
                        extra["config"] = self._config(
                            op, "tuned" if separate else provider,
                            case.separate if separate else case.kernels, case)
                        if family != op:
                            extra["note"] = (f"runs {family}'s kernels, as the library's "
                                             "compositions do at this batch")
                        if "error" not in result:
                            extra["bare_launch_us"] = self._bare_launch_us(fn)
                    single = len(case.kernels) == 1
                    if provider == "tuned" and single and "error" not in result:
                        reference = _as_tuple(fn())
                    elif provider in PEERS and reference is not None and "error" not in result:
                        extra["max_rel_err"] = self._check(reference, fn)
                rows.append(self._row(op, label, case.pass_, provider, result, **extra))
                steps.step(f"{op} {label} {case.pass_} {provider}")
        return rows

    def _bare_launch_us(self, fn: Callable[[], Any]) -> float | None:
        """Host cost of the same launches as one call of ``fn``, made by PyCUDA's plain
        prepared call with every argument ready: what the call's own Python adds is its
        python_call_us minus this."""
        with recorded_launches() as launches:
            fn()
        self.harness.sync()
        if not launches:
            return None

        def bare() -> None:
            for kernel, *launch in launches:
                kernel.bare(*launch)
        return self.harness.time(bare, max(self.reps // 3, 5))["python_call_us"]

    def _config(self, op: str, provider: str, kernels: Sequence[KernelSpec],
                case: BenchCase) -> str:
        """The launch parameters ``kernels`` ran with, and where they came from (a fused kernel
        the op runs as the kernels it fuses, as FrdHeadSmall's ``backward``: theirs)."""
        out = {}
        for k in kernels:
            chosen = getattr(self._library(k.family, provider, case), "chosen", {})
            for spec in (k,) if k.role in chosen else self.catalog.unfused(k):
                if spec.role in chosen:
                    out[spec.role if spec.family == op else spec.id] = chosen[spec.role]
        return json.dumps(out, sort_keys=True)

    def _check(self, library_out: tuple[Any, ...], peer: Callable[[], Any]) -> float | None:
        """Largest relative difference of the peer's outputs from the tuned kernels'."""
        try:
            err = self.peers.max_rel_err(library_out, _as_tuple(peer()))
        except Exception as exc:
            log.warning("peer check failed: %s", timing.error_text(exc))
            return None
        if err > 1e-3:
            log.warning("torch peer disagrees with the library: max rel err %.3g", err)
        return err


def _spread(t: Mapping[str, float]) -> float:
    return t["p80_us"] / t["p20_us"] if t.get("p20_us") else float("inf")


def _bound(spec: KernelSpec, op: Any, inputs: Mapping[str, Any]) -> Callable[[], Any]:
    """The op's method called as a user calls it: arguments gathered once, so python_call_us
    is the library's host cost and not the catalog's."""
    method, kwargs = getattr(op, spec.method), dict(spec.call_kwargs)
    args = tuple(inputs[n] for n in spec.reads)
    return lambda: method(*args, **kwargs)


def _chain(fns: Sequence[Callable[[], Any]]) -> Callable[[], Any]:
    if len(fns) == 1:
        return fns[0]
    return lambda: [f() for f in fns]


def _as_tuple(out: Any) -> tuple[Any, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def summary(rows: Sequence[Mapping[str, str]]) -> str:
    """A plain table of one run's medians (what the device call's output tail shows)."""
    cols = ("tuned", "default", "torch_eager", "torch_compile", "floor")
    table: dict[tuple[str, str, str], dict[str, str]] = {}
    for r in rows:
        if r["provider"] in cols:
            v = float(r["median_us"]) if r.get("median_us") else None
            if v is None:  # a row with no time: failed, or says why it has none
                cell = "error" if r.get("error") else (r.get("note") or "-").split(":")[0]
            else:
                cell = f"{v:.1f}" if v >= 1 else f"{v:.3f}"
            table.setdefault((r["op"], r["shape"], r["pass"]), {})[r["provider"]] = cell
    lines = [f"{'op':9} {'shape':16} {'pass':9} " + " ".join(f"{c:>13}" for c in cols)]
    for (op, shape, pass_), cells in table.items():
        lines.append(f"{op:9} {shape:16} {pass_:9} "
                     + " ".join(f"{cells.get(c, '-'):>13}" for c in cols))
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ops", type=records.name_list([*catalog().families(), *COMPOSED],
                                                        "ops"),
                        default=[*(f for f in catalog().families() if f != "reduce"),
                                 *COMPOSED],
                        help="ops to measure, e.g. pool,step (default: every op but reduce, "
                             "which the backward passes include, the composed head step, "
                             "the PyTorch training steps and the whole training step "
                             "train_step)")
    parser.add_argument("--quick", action="store_true",
                        help="smallest and largest shape of each op, fewer repetitions")
    parser.add_argument("--out", type=Path, default=Path("reports"),
                        help="reports folder; rows go to OUT/<gpu-slug>/bench.csv")
    parser.add_argument("--commit", default=None,
                        help="commit to record (default: git describe, else 'unknown')")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("bench", description=__doc__,
                                   help="time every op against PyTorch and the floor (GPU)",
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    start, started = time.perf_counter(), time.time()
    harness = CudaHarness()  # no GPU: cli.main reports it in one line on stderr, exit 2
    bench = Bench(harness, args.ops, args.quick, args.out,
                  args.commit or records.git_state()["describe"])
    path = bench.run()
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["date"] == bench.base["date"]]
    print(summary(rows))
    print(f"{len(rows)} rows appended to {path} in {time.perf_counter() - start:.0f} s")
    subset = " ".join([*(["ops " + ",".join(args.ops)] if args.ops else []),
                       *(["quick"] if args.quick else [])])
    records.log_phase(path.parent, "bench", started, 0, subset)
    return 0

