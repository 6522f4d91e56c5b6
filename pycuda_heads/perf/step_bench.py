"""The ``step`` rows of the bench: the head's whole training step (pool -> residual -> gate
forward, then the backward chain) as wall time per step over many steps, the way a trainer
pays for it, host and GPU together.

Providers: the library launching kernel by kernel (``library_eager``) and replaying the step's
CUDA graph (``library_graph``); the same step in PyTorch with autograd, eager, through
``torch.compile`` and through ``torch.compile(mode="reduce-overhead")`` (CUDA graphs)."""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping

import numpy as np

from ..catalog import SUITE_TEMPLATE, catalog
from ..records import FWD_BWD, STEP_OP, dims_label
from .timing import error_text

SHAPES = ({"B": 2, "K": 8}, {"B": 256, "K": 64})
LIBRARY = ("library_eager", "library_graph")
PEERS = {"torch_eager": None, "torch_compile": "default",
         "torch_compile_ro": "reduce-overhead"}
#: the leaves the step differentiates, in the order of the torch forward's arguments
LEAVES = ("q_h", "ln", "w_res", "bias_res", "head", "alpha")


def inputs(shape: Mapping[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    from ..step import INPUTS
    dims = {"B": shape["B"], "K": shape["K"], "H": SUITE_TEMPLATE["N_HORIZONS"],
            "D": SUITE_TEMPLATE["HIDDEN_DIM"]}
    rng = np.random.default_rng(seed)
    x = {n: rng.standard_normal(tuple(dims[a] for a in axes)).astype(np.float32)
         for n, axes in INPUTS.items()}
    x["alpha"] = rng.uniform(-1, 1, x["alpha"].shape).astype(np.float32)
    return x


def error(exc: Exception) -> dict[str, str]:
    """A provider's result when it failed: the error, short enough for a CSV cell."""
    return {"error": error_text(exc)}


def wall_us(steps: Mapping[str, tuple[Callable[[], Any], Callable[[], None]]], reps: int = 9,
            target_s: float = 0.05) -> dict[str, dict[str, Any]]:
    """Per provider of ``steps`` (name -> (step, sync)): the median (p20, p80) wall time per
    step of ``reps`` runs of many steps back to back, each run ended by its synchronisation.

    The providers take turns run by run, each round in a rotated order, so a drift of a noisy
    host reaches every provider alike instead of whichever was timed last. A provider whose
    step raises gets ``{"error": ...}`` and leaves the rotation; the others go on."""
    counts: dict[str, int] = {}
    samples: dict[str, list[float]] = {}
    out: dict[str, dict[str, Any]] = {}


    def run(name: str, n: int) -> float:
        step, sync = steps[name]
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        sync()
        return time.perf_counter() - t0

    for name in steps:
        try:
            run(name, 10)  # warm: compilation, graph recording, allocator growth
            counts[name] = max(20, int(target_s / max(run(name, 10) / 10, 1e-7)))
            samples[name] = []
        except Exception as exc:
            out[name] = error(exc)
    for r in range(reps):
        live = list(samples)
        k = r % len(live) if live else 0
        for name in live[k:] + live[:k]:
            try:
                samples[name].append(run(name, counts[name]) / counts[name] * 1e6)
            except Exception as exc:
                out[name] = error(exc)
                del samples[name]
    for name, got in samples.items():
        out[name] = {"median_us": float(np.median(got)), "p20_us": float(np.percentile(got, 20)),
                     "p80_us": float(np.percentile(got, 80)), "reps": reps}
    return {name: out[name] for name in steps}


def library_steps(x: Mapping[str, np.ndarray], shape: Mapping[str, int]) -> dict[str, Any]:
    """provider -> (step, sync) of the library."""
    from ..step import HeadStep
    step = HeadStep(SUITE_TEMPLATE["N_HORIZONS"], SUITE_TEMPLATE["HIDDEN_DIM"], shape["B"],
                    shape["K"])
    for name, arr in step.inputs.items():
        arr.set(x[name])
    return {"library_eager": (step.run, step.synchronize),
            "library_graph": (step.replay, step.synchronize)}


def torch_steps(torch: Any, x: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """provider -> (step, sync): the kernels' declared torch peers composed into the forward,
    the gradients of every leaf from grad_out by autograd."""
    specs = catalog()
    pool, residual, gate = (specs[k].peer for k in ("pool.forward", "residual.forward",
                                                   "gate.forward"))

    def forward(q_h: Any, ln: Any, w_res: Any, bias_res: Any, head: Any, alpha: Any) -> Any:
        ctx, _ = pool(torch, q_h, ln)
        return gate(torch, head, residual(torch, ctx, w_res, bias_res), alpha)

    leaves = [torch.from_numpy(x[n]).cuda().requires_grad_(True) for n in LEAVES]
    grad_out = torch.from_numpy(x["grad_out"]).cuda()
    out = {}
    for provider, mode in PEERS.items():
        fn = forward if mode is None else torch.compile(forward, mode=mode, dynamic=False)

        def step(fn: Callable[..., Any] = fn, mode: str | None = mode) -> Any:
            if mode == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            return torch.autograd.grad(fn(*leaves), leaves, grad_out)
        out[provider] = (step, torch.cuda.synchronize)
    return out


def rows(row: Callable[..., dict[str, Any]], torch: Any | None,
         warn: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every step row of one run; ``row(op, shape, pass, provider, result)`` adds the run's
    common columns. A provider that fails gets an error row, never ends the run."""
    out = []
    for shape in SHAPES:
        x = inputs(shape)
        providers: dict[str, Any] = {}
        for make in (lambda: library_steps(x, shape),
                     lambda: torch_steps(torch, x) if torch is not None else {}):
            try:
                providers.update(make())
            except Exception as exc:  # e.g. no cuda-bindings for the graph, no torch
                warn(f"step {dims_label(shape)}: {type(exc).__name__}: {exc}")
        timed = wall_us(providers)
        for provider in (*LIBRARY, *(PEERS if torch is not None else ())):
            result = timed.get(provider, {"error": "could not be set up (see the log)"})
            out.append(row(STEP_OP, dims_label(shape), FWD_BWD, provider, result))
    return out
