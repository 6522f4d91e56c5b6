"""``pycuda-heads bench``: every op x suite shape x pass against what a user would otherwise run.

Providers, measured side by side in one process on one GPU:
  tuned          the library with ``launch=None`` (the tuned table, else the default)
  default        the library with every kernel's default launch parameters
  torch_eager    the same math in PyTorch ops (``peers_torch``), when torch is importable
  torch_compile  the same functions through ``torch.compile(dynamic=False)``, compiled per shape
  floor          bytes that must move / device copy bandwidth measured in this run
  empty_kernel   one empty kernel launch (once per run), the yardstick of the small shapes

GPU time comes from ``timing.gpu_time_us``: batches of calls queued behind a spin kernel, so the
CUDA events time the GPU's work, not the Python that enqueues it; the Python cost of a call is
timed on the host meanwhile (``python_call_us``). Rows go to ``<out>/<gpu-slug>/bench.csv``.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import functools
import importlib
import json
import logging
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from . import __version__, device, timing
from .alpha_gate import AlphaGate
from .attention_pool import PerHorizonAttentionPool
from .floor import floor_bytes as kernel_floor_bytes
from .frd import FrdSoftmaxCE
from .registry import SUITE_TEMPLATE
from .residual import PerHorizonResidual
from .suite import FRD_SHAPES, POOL_SHAPES, RESIDUAL_SHAPES

log = logging.getLogger("pycuda_heads.bench")

OPS = ("pool", "residual", "gate", "frd")
SHAPES: dict[str, tuple[dict[str, int], ...]] = {
    "pool": POOL_SHAPES, "residual": RESIDUAL_SHAPES, "gate": RESIDUAL_SHAPES, "frd": FRD_SHAPES}
LIBRARY = ("tuned", "default")
PEERS = ("torch_eager", "torch_compile")
BOTH = "fwd+bwd"
COLUMNS = ("date", "commit", "gpu", "driver_version", "cuda_version", "library_version",
           "torch_version", "op", "shape", "pass", "provider", "median_us", "p20_us", "p80_us",
           "reps", "python_call_us", "floor_bytes", "copy_bandwidth_GBps", "max_rel_err",
           "config", "error")


@dataclass(frozen=True)
class Pass:
    """One call of an op: the library method (and the torch peer of the same name and
    arguments), the tensors it reads in argument order and the tensors it writes."""

    method: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]


# The single place the bytes of the floor come from. The FRD kernel is one fused pass (loss and
# gradient): it is reported as fwd+bwd. The gate's grad_head is grad_out itself: nothing written.
PRIMITIVES: dict[tuple[str, str], Pass] = {
    ("pool", "forward"): Pass("forward", ("q_h", "ln"), ("ctx", "attn")),
    ("pool", "backward"): Pass("backward", ("q_h", "ln", "attn", "grad_ctx"),
                               ("grad_q_h", "grad_ln")),
    ("residual", "forward"): Pass("forward", ("ctx", "w_res", "bias_res"), ("residual",)),
    ("residual", "backward"): Pass("backward", ("ctx", "w_res", "grad_residual"),
                                   ("grad_w_res", "grad_bias_res", "grad_ctx")),
    ("gate", "forward"): Pass("forward", ("head", "residual", "alpha"), ("out",)),
    ("gate", "backward"): Pass("backward", ("residual", "alpha", "grad_out"),
                               ("grad_residual", "grad_alpha")),
    ("frd", BOTH): Pass("softmax_ce_grad", ("logits", "labels"), ("grad_logits", "ce")),
}


# The kernel behind each primitive pass (the FRD pass is the one fused kernel).
KERNEL_OF = {(op, p): "frd.softmax_ce_grad" if op == "frd" else f"{op}.{p}"
             for op, p in PRIMITIVES}


def tensor_shapes(op: str, shape: Mapping[str, int],
                  template: Mapping[str, int] = SUITE_TEMPLATE) -> dict[str, tuple[int, ...]]:
    """Shape of every tensor an op's passes read or write."""
    h, d, a, b = template["N_HORIZONS"], template["HIDDEN_DIM"], template["N_ATOMS"], shape["B"]
    if op == "pool":
        k = shape["K"]
        return {"q_h": (h, d), "ln": (b, k, d), "attn": (b, h, k), "grad_ctx": (b, h, d),
                "ctx": (b, h, d), "grad_q_h": (h, d), "grad_ln": (b, k, d)}
    if op == "residual":
        return {"ctx": (b, h, d), "w_res": (h, d), "bias_res": (h,), "grad_residual": (b, h),
                "residual": (b, h), "grad_w_res": (h, d), "grad_bias_res": (h,),
                "grad_ctx": (b, h, d)}
    if op == "gate":
        return {"head": (b, h), "residual": (b, h), "alpha": (h,), "grad_out": (b, h),
                "out": (b, h), "grad_residual": (b, h), "grad_alpha": (h,)}
    if op == "frd":
        return {"logits": (b, h, a), "labels": (b, h), "grad_logits": (b, h, a), "ce": (b, h)}
    raise ValueError(f"unknown op {op!r}; expected one of {OPS}")


def passes(op: str) -> tuple[str, ...]:
    """The passes reported for ``op``: its primitive calls, then fwd+bwd when it has both."""
    own = tuple(p for o, p in PRIMITIVES if o == op)
    return own + (BOTH,) if {"forward", "backward"} <= set(own) else own


def primitives(op: str, pass_: str) -> tuple[str, ...]:
    """The primitive passes (keys of PRIMITIVES) one reported pass calls, in order."""
    if (op, pass_) in PRIMITIVES:
        return (pass_,)
    if pass_ == BOTH and BOTH in passes(op):
        return "forward", "backward"
    raise ValueError(f"{op} has no pass {pass_!r}; expected one of {passes(op)}")


def floor_bytes(op: str, pass_: str, shape: Mapping[str, int],
                template: Mapping[str, int] = SUITE_TEMPLATE) -> int:
    """Bytes ``pass_`` must move: each argument read once, each output written once
    (``floor.floor_bytes`` of the kernels it calls).

    fwd+bwd is the sum of the two passes: the rest of the network runs between them, so the
    backward reads its inputs again.
    """
    return sum(kernel_floor_bytes(KERNEL_OF[op, p], template, shape)
               for p in primitives(op, pass_))


def shape_label(shape: Mapping[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items())


def make_inputs(op: str, shape: Mapping[str, int], seed: int = 0,
                template: Mapping[str, int] = SUITE_TEMPLATE) -> dict[str, np.ndarray]:
    """Random non-zero arguments of every pass of ``op``: normal floats, attn rows that are
    softmaxes, FRD labels uniform in [-1, N_ATOMS) (so about 1 in 22 is the -1 sentinel)."""
    rng = np.random.default_rng(seed)
    dims = tensor_shapes(op, shape, template)
    names = sorted({n for (o, _), p in PRIMITIVES.items() if o == op for n in p.reads})
    out: dict[str, np.ndarray] = {}
    for name in names:
        if name == "labels":
            out[name] = rng.integers(-1, template["N_ATOMS"], size=dims[name], dtype=np.int32)
        elif name == "attn":
            s = rng.standard_normal(dims[name], dtype=np.float32)
            e = np.exp(s - s.max(axis=-1, keepdims=True))
            out[name] = e / e.sum(axis=-1, keepdims=True)
        else:
            out[name] = rng.standard_normal(dims[name], dtype=np.float32)
    return out


def make_op(op: str, provider: str, template: Mapping[str, int] = SUITE_TEMPLATE) -> Any:
    """The library op object of ``provider``: tuned table (launch=None) or every default."""
    h, d, a = template["N_HORIZONS"], template["HIDDEN_DIM"], template["N_ATOMS"]
    cls, args = {"pool": (PerHorizonAttentionPool, (h, d)),
                 "residual": (PerHorizonResidual, (h, d)),
                 "gate": (AlphaGate, (h,)), "frd": (FrdSoftmaxCE, (h, a))}[op]
    launch = None if provider == "tuned" else {
        role: dict(space.default) for role, space in cls.SPACES.items()}
    return cls(*args, launch=launch)


def library_call(obj: Any, op: str, pass_: str, x: Mapping[str, Any]) -> Callable[[], Any]:
    p = PRIMITIVES[op, pass_]
    method, args = getattr(obj, p.method), [x[n] for n in p.reads]
    if op == "frd":
        # Labels are valid by construction; the optional device check costs two reductions and
        # a host sync, which is validation, not the kernel.
        return lambda: method(*args, check_labels=False)
    return lambda: method(*args)


class CudaHarness:
    """The GPU side of the bench (PyCUDA, primary context shared with torch, default stream)."""

    torch_device = "cuda"

    def __init__(self) -> None:
        self._drv = device.cuda()
        self.slug = device.gpu_slug()

    def env(self) -> dict[str, str]:
        v = self._drv.get_driver_version()
        return {"gpu": device.gpu_name(), "driver_version": _driver_version(),
                "cuda_version": f"{v // 1000}.{v % 1000 // 10}"}

    def upload(self, x: Mapping[str, np.ndarray]) -> dict[str, Any]:
        import pycuda.gpuarray as gpuarray
        return {name: gpuarray.to_gpu(a) for name, a in x.items()}

    def library_op(self, op: str, provider: str) -> Any:
        return make_op(op, provider)

    def sync(self) -> None:
        self._drv.Context.synchronize()

    def empty_launch(self) -> Callable[[], None]:
        return timing.empty_launch

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
        """GPU time (median, p20, p80) and Python call cost of a warm ``fn``."""
        return timing.gpu_time_us(fn, reps=reps)


def _driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.strip().splitlines()[0] if out.strip() else "unknown"


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                             text=True, timeout=20, check=True,
                             cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out or "unknown"


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
    except Exception as exc:  # a missing or broken torch makes error rows, never a crash
        return None, "absent", f"torch unusable: {type(exc).__name__}: {exc}"
    return peers, peers.torch.__version__, ""


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")[:400]


class Bench:
    """One run: measures op x shape x pass x provider and appends the rows per shape."""

    def __init__(self, harness: Any, ops: Sequence[str], quick: bool, out_root: Path,
                 commit: str) -> None:
        self.harness, self.ops, self.quick = harness, tuple(ops), quick
        self.reps = 10 if quick else 30
        self.path = Path(out_root) / harness.slug / "bench.csv"
        self.peers, torch_version, self.torch_error = _load_peers(harness.torch_device)
        self.base = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                         timespec="seconds"),
                     "commit": commit, "library_version": __version__,
                     "torch_version": torch_version, **harness.env()}
        self._ops: dict[tuple[str, str], Any] = {}
        self.bandwidth = float("nan")  # GB/s, measured first thing in run()

    def shapes(self, op: str) -> tuple[dict[str, int], ...]:
        suite = SHAPES[op]
        return (suite[0], suite[-1]) if self.quick else suite

    def run(self) -> Path:
        from tqdm import tqdm
        if self.torch_error:
            log.warning("%s: the torch providers are recorded as errors", self.torch_error)
        self.bandwidth = self.harness.copy_bandwidth_gbps()
        log.info("device copy bandwidth %.0f GB/s", self.bandwidth)
        plan = [(op, shape) for op in self.ops for shape in self.shapes(op)]
        total = 1 + sum(len(passes(op)) * (len(LIBRARY) + len(PEERS)) for op, _ in plan)
        with tqdm(total=total, desc="bench", unit="case", mininterval=1.0) as bar:
            empty = self._measure(self.harness.empty_launch(), "empty kernel")
            append_rows(self.path, [self._row("empty_kernel", "-", "-", "empty_kernel", empty)])
            bar.update()
            for op, shape in plan:
                bar.set_postfix_str(f"{op} {shape_label(shape)}")
                append_rows(self.path, self._shape_rows(op, shape, bar))
        return self.path

    def _row(self, op: str, shape: str, pass_: str, provider: str,
             result: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
        return {**self.base, "op": op, "shape": shape, "pass": pass_, "provider": provider,
                "copy_bandwidth_GBps": self.bandwidth, **result, **extra}

    def _measure(self, fn: Callable[[], Any], what: str) -> dict[str, Any]:
        try:
            for _ in range(3):  # compile, allocate, fill the caches
                fn()
            self.harness.sync()
            t = self.harness.time(fn, self.reps)
        except Exception as exc:  # one failing provider must not end the run
            log.warning("%s failed: %s", what, _error(exc))
            return {"error": _error(exc)}
        return {k: t[k] for k in ("median_us", "p20_us", "p80_us", "reps", "python_call_us")}

    def _library(self, op: str, provider: str) -> Any:
        key = (op, provider)
        if key not in self._ops:
            self._ops[key] = self.harness.library_op(op, provider)
        return self._ops[key]

    def _calls(self, op: str, x_lib: Mapping[str, Any],
               x_torch: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
        """provider -> primitive pass -> callable, or provider -> error text."""
        calls: dict[str, Any] = {}
        own = [p for o, p in PRIMITIVES if o == op]
        for provider in LIBRARY:
            try:
                obj = self._library(op, provider)
                calls[provider] = {p: library_call(obj, op, p, x_lib) for p in own}
            except Exception as exc:
                calls[provider] = _error(exc)
        for provider in PEERS:
            if self.peers is None:
                calls[provider] = self.torch_error
                continue
            wrap = self.peers.compiled if provider == "torch_compile" else (lambda f: f)
            calls[provider] = {p: functools.partial(wrap(self.peers.FUNCTIONS[op, p]),
                                                    *[x_torch[n] for n in PRIMITIVES[op, p].reads])
                               for p in own}
        return calls

    def _shape_rows(self, op: str, shape: Mapping[str, int], bar: Any) -> list[dict[str, Any]]:
        label = shape_label(shape)
        x = make_inputs(op, shape)
        x_lib = self.harness.upload(x)
        x_torch = None
        if self.peers is not None:
            self.peers.reset()  # a fresh compile cache per shape: no recompile limits
            x_torch = self.peers.to_torch(x, self.harness.torch_device)
        calls = self._calls(op, x_lib, x_torch)
        rows = []
        for pass_ in passes(op):
            fb = floor_bytes(op, pass_, shape)
            floor_us = fb / (self.bandwidth * 1e3)
            rows.append(self._row(op, label, pass_, "floor",
                                  {"median_us": floor_us, "p20_us": floor_us, "p80_us": floor_us},
                                  floor_bytes=fb))
            reference = None
            for provider, got in calls.items():
                extra: dict[str, Any] = {"floor_bytes": fb}
                if isinstance(got, str):
                    result: dict[str, Any] = {"error": got}
                else:
                    fn = _chain([got[p] for p in primitives(op, pass_)])
                    result = self._measure(fn, f"{op} {label} {pass_} {provider}")
                    if provider in LIBRARY:
                        extra["config"] = self._config(op, provider, pass_)
                    if provider == "tuned" and pass_ in got and "error" not in result:
                        reference = _as_tuple(fn())
                    elif provider in PEERS and reference is not None and "error" not in result:
                        extra["max_rel_err"] = self._check(reference, fn)
                rows.append(self._row(op, label, pass_, provider, result, **extra))
                bar.update()
        return rows

    def _config(self, op: str, provider: str, pass_: str) -> str:
        """The launch parameters this pass's kernels ran with, and where they came from."""
        chosen = getattr(self._library(op, provider), "chosen", {})
        roles = [PRIMITIVES[op, p].method for p in primitives(op, pass_)]
        return json.dumps({r: chosen[r] for r in roles if r in chosen}, sort_keys=True)

    def _check(self, library_out: tuple[Any, ...], peer: Callable[[], Any]) -> float | None:
        """Largest relative difference of the peer's outputs from the tuned kernels'."""
        try:
            err = self.peers.max_rel_err(library_out, _as_tuple(peer()))
        except Exception as exc:
            log.warning("peer check failed: %s", _error(exc))
            return None
        if err > 1e-3:
            log.warning("torch peer disagrees with the library: max rel err %.3g", err)
        return err


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
            cell = "error" if v is None else f"{v:.1f}" if v >= 1 else f"{v:.3f}"
            table.setdefault((r["op"], r["shape"], r["pass"]), {})[r["provider"]] = cell
    lines = [f"{'op':9} {'shape':16} {'pass':9} " + " ".join(f"{c:>13}" for c in cols)]
    for (op, shape, pass_), cells in table.items():
        lines.append(f"{op:9} {shape:16} {pass_:9} "
                     + " ".join(f"{cells.get(c, '-'):>13}" for c in cols))
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS),
                        help="ops to measure (default: all)")
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
    start = time.perf_counter()
    bench = Bench(CudaHarness(), args.ops, args.quick, args.out, args.commit or git_commit())
    path = bench.run()
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["date"] == bench.base["date"]]
    print(summary(rows))
    print(f"{len(rows)} rows appended to {path} in {time.perf_counter() - start:.0f} s")
    return 0

