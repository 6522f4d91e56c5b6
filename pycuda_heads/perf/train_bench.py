"""The ``train_step`` rows of the bench: the whole head's training step (``TrainStep``: pool,
residual + gate and FRD head forward, the loss, the backward and one Adam step of the eight
parameters) as wall time per step over many steps, host and GPU together.

Providers, in one run: the library replaying the step's CUDA graph (``library_graph``) and
launching it kernel by kernel (``library_eager``); the same model in plain torch (the kernels'
declared peers, ``cross_entropy`` and ``torch.optim.Adam(fused=True)``) eager, through
``torch.compile`` and through ``torch.compile(mode="reduce-overhead")``; and ``kernel_sum``, the
sum of the GPU times of the step's kernels each timed alone: the floor of a graph replay.

The ``train_step_adam`` rows time the optimizer alone over the step's eight parameters (GPU
time): the multi-tensor launch (``library_multi``) against ``torch.optim.Adam(fused=True)`` on
the same tensors (``torch_fused``). Their ``floor`` is the HBM floor only where the arrays
exceed the L2 cache; otherwise the row says they are L2-resident and gives no floor."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from ..catalog import SUITE_TEMPLATE, catalog
from ..core.compile import recorded_launches
from ..records import FWD_BWD, TRAIN_ADAM_OP, TRAIN_STEP_OP, dims_label
from . import timing
from .step_bench import error, wall_us

SHAPES = ({"B": 2, "K": 8}, {"B": 256, "K": 64}, {"B": 4096, "K": 256})
H, D, A = SUITE_TEMPLATE["N_HORIZONS"], SUITE_TEMPLATE["HIDDEN_DIM"], SUITE_TEMPLATE["N_ATOMS"]
F = SUITE_TEMPLATE["FRD_HIDDEN"]
LR = 1e-3
PEERS = {"torch_eager": None, "torch_compile": "default", "torch_compile_ro": "reduce-overhead"}
KERNEL_SUM = "kernel_sum"
#: bytes an Adam step moves per parameter: param, grad, m, v read; param, m, v written
ADAM_BYTES = 7 * 4


def model(shape: Mapping[str, int], seed: int = 0) -> tuple[dict, dict]:
    """(parameters, one step's data) as NumPy arrays: fan-in scaled weights, an open gate,
    labels with sentinel rows."""
    from ..step import DATA, PARAMS
    dims = {"B": shape["B"], "K": shape["K"], "H": H, "D": D, "F": F, "A": A}
    rng = np.random.default_rng(seed)
    params = {}
    for name, axes in PARAMS.items():
        s = tuple(dims[a] for a in axes)
        params[name] = (rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32)
    params["alpha"] = rng.uniform(-1, 1, H).astype(np.float32)
    data = {n: rng.standard_normal(tuple(dims[a] for a in axes)).astype(np.float32)
            for n, axes in DATA.items() if n != "labels"}
    labels = rng.integers(0, A, (shape["B"], H)).astype(np.int32)
    labels[-1, 1:] = -1
    return params, {**data, "labels": labels}


def library_step(shape: Mapping[str, int], params: dict, data: dict) -> Any:
    from ..step import TrainStep
    step = TrainStep(H, D, shape["B"], shape["K"], frd_hidden=F, n_atoms=A, lr=LR)
    step.load(params)
    step.feed(**data)
    return step


def kernel_sum_us(step: Any, reps: int) -> dict[str, Any]:
    """The step's launches (one eager step's, recorded), each timed alone on the GPU: the sum
    of their medians, how many there are, and each one's entry, grid and median (``note``)."""
    with recorded_launches() as launches:
        step.run()
    step.synchronize()
    times = [timing.gpu_time_us(lambda: kernel.bare(grid, block, args, shared, stream),
                                reps)["median_us"]
             for kernel, grid, block, args, shared, stream in launches]
    each = [f"{k.name} {'x'.join(map(str, grid))} {t:.2f}"
            for (k, grid, *_), t in zip(launches, times)]
    total = sum(times)
    return {"median_us": total, "p20_us": total, "p80_us": total, "reps": reps,
            "config": f"{len(launches)} kernels", "note": "; ".join(each)}


def torch_model(torch: Any, params: dict, device: str = "cuda") -> tuple[Callable, list]:
    """(loss(ln, h_t, base, y, labels), its parameters): the model in plain torch ops."""
    from ..step import FRD_WEIGHT
    specs = catalog()
    pool, gate, head = (specs[k].peer for k in ("pool.forward", "resgate.forward",
                                                "frdhead.forward"))
    p = {n: torch.nn.Parameter(torch.from_numpy(v).to(device)) for n, v in params.items()}
    ce = torch.nn.functional.cross_entropy

    def loss(ln: Any, h_t: Any, base: Any, y: Any, labels: Any) -> Any:
        ctx, _ = pool(torch, p["q_h"], ln)
        out, _ = gate(torch, ctx, p["w_res"], p["bias_res"], base, p["alpha"])
        _, logits = head(torch, h_t, p["w1"], p["b1"], p["w2"], p["b2"])
        frd = ce(logits.reshape(-1, A), labels.reshape(-1).long(), ignore_index=-1,
                 reduction="sum")
        return ((out - y) ** 2).mean() + FRD_WEIGHT * frd / ln.shape[0]
    return loss, list(p.values())


def _try(fn: Callable[[], dict[str, Any]], warn: Callable[[str], None],
         what: str) -> dict[str, Any]:
    try:
        return fn()
    except Exception as exc:  # one provider failing never ends the run
        warn(f"{what}: {type(exc).__name__}: {exc}")
        return error(exc)


def adam_rows(row: Callable[..., dict[str, Any]], torch: Any | None, step: Any,
              bandwidth_gbps: float, l2_bytes: int, warn: Callable[[str], None],
              reps: int) -> list[dict[str, Any]]:
    """The optimizer alone over the step's parameters: multi-tensor launch, torch fused, floor."""
    names = list(step.params)
    grads = [step.outputs[f"grad_{n}"] for n in names]
    args = ([step.params[n] for n in names], grads, [step.m[n] for n in names],
            [step.v[n] for n in names])
    n = sum(int(a.size) for a in args[0])
    label = f"{len(names)} tensors,N={n}"
    moved = ADAM_BYTES * n
    t = {"t": 0}

    def multi() -> None:
        t["t"] += 1
        step.adam.step_all(*args, t["t"])
    out = [row(TRAIN_ADAM_OP, label, "step", "library_multi",
               _try(lambda: _gpu(timing.gpu_time_us(multi, reps)), warn, "multi-tensor Adam"),
               floor_bytes=moved)]
    if torch is not None:
        def fused() -> dict[str, Any]:
            from .torch_train import adam_step
            _, plain = torch_model(torch, {k: v.get() for k, v in step.params.items()})
            return _gpu(timing.gpu_time_us(adam_step(torch, plain), reps))
        out.append(row(TRAIN_ADAM_OP, label, "step", "torch_fused",
                       _try(fused, warn, "torch fused Adam"), floor_bytes=moved))
    if moved > l2_bytes:
        floor = moved / (bandwidth_gbps * 1e3)
        result: dict[str, Any] = {"median_us": floor, "p20_us": floor, "p80_us": floor}
    else:
        result = {"note": f"L2-resident: {moved} B moved, L2 holds {l2_bytes} B; no HBM floor"}
    out.append(row(TRAIN_ADAM_OP, label, "step", "floor", result, floor_bytes=moved))
    return out


def _gpu(t: Mapping[str, Any]) -> dict[str, Any]:
    return {k: t[k] for k in ("median_us", "p20_us", "p80_us", "reps", "python_call_us")}


def rows(row: Callable[..., dict[str, Any]], torch: Any | None, bandwidth_gbps: float,
         l2_bytes: int, warn: Callable[[str], None], reps: int = 30) -> list[dict[str, Any]]:
    """Every train_step row of one run (and the Adam rows at the smallest shape, whose
    parameters are every shape's); ``row(op, shape, pass, provider, result, **extra)`` adds the
    run's common columns."""
    out = []
    for shape in SHAPES:
        label = dims_label(shape)
        params, data = model(shape)
        try:
            step = library_step(shape, params, data)
        except Exception as exc:
            warn(f"train_step {label}: {type(exc).__name__}: {exc}")
            out += [row(TRAIN_STEP_OP, label, FWD_BWD, p, {"error": str(exc)[:400]})
                    for p in ("library_graph", "library_eager", KERNEL_SUM)]
            continue
        sync = step.synchronize
        steps = {"library_graph": (step.replay, sync), "library_eager": (step.run, sync)}
        failed: dict[str, dict[str, Any]] = {}
        if torch is not None:
            from .torch_train import train_step
            inputs = [torch.from_numpy(data[n]).cuda() for n in ("ln", "h_t", "base", "y",
                                                                  "labels")]
            for provider, mode in PEERS.items():
                try:
                    loss, plain = torch_model(torch, params)
                    steps[provider] = (train_step(torch, loss, plain, inputs, mode),
                                       torch.cuda.synchronize)
                except Exception as exc:  # one provider failing never ends the run
                    failed[provider] = error(exc)
        timed = {**wall_us(steps), **failed}  # the providers in turns
        for provider, result in timed.items():
            if "error" in result:
                warn(f"train_step {label} {provider}: {result['error']}")
        for provider in ("library_graph", "library_eager"):
            out.append(row(TRAIN_STEP_OP, label, FWD_BWD, provider, timed[provider]))
        out.append(row(TRAIN_STEP_OP, label, FWD_BWD, KERNEL_SUM,
                       _try(lambda: kernel_sum_us(step, reps), warn, "train_step kernel sum")))
        out += [row(TRAIN_STEP_OP, label, FWD_BWD, p, timed[p]) for p in PEERS if p in timed]
        if shape is SHAPES[0]:
            out += adam_rows(row, torch, step, bandwidth_gbps, l2_bytes, warn, reps)
    return out
