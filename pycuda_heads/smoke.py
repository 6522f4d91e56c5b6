"""``pycuda-heads smoke``: one epoch of training of the whole head on synthetic data from a fixed
random teacher, on the GPU, checked against itself and against float64.

The model: ln[B, K, D] -> per-horizon attention pool -> residual projection -> alpha gate added
to a base per-horizon output ``base`` (given with the data); the FRD head runs on h_t = ln[:, -1]
and its logits go through the softmax-CE. The loss of a step is

    mean_{b,h} (out - y)^2  +  LAMBDA_FRD * sum(ce) / B

with y the teacher's gated output and the labels the teacher FRD head's argmax atoms; the label
stream ends with sentinel rows (the longest horizons of the last rows are not realised: -1).
Every parameter takes a bias-corrected Adam step. On the GPU the whole step is one
``TrainStep`` replayed as a CUDA graph (one launch a step; the loss is computed on the device).
The same step runs in float64 NumPy (``reference.py``) for the reference comparison of the
first steps.

Recorded in ``reports/<gpu>/smoke_training.json``: loss_first (step 1), loss_last (the last
step), nan, bitwise_rerun (a second run from scratch gives bitwise the same losses and
parameters), graph_eager_bitwise (the first EAGER_STEPS steps launched kernel by kernel give
bitwise the graph's losses and parameters; both loss series are recorded), reference_match (the
first REFERENCE_STEPS losses within 1e-4 relative of float64), steps, and the per-step losses
the report plots.
"""
from __future__ import annotations

import argparse
import datetime
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import records
from . import reference as ref

LAMBDA_FRD = 0.5
REFERENCE_STEPS, REFERENCE_RTOL = 3, 1e-4
EAGER_STEPS = 20
F32 = np.float32


@dataclass(frozen=True)
class Config:
    steps: int = 300
    batch: int = 256
    seq: int = 8
    dim: int = 128          # HIDDEN_DIM of the pool and D_in of the FRD head
    hidden: int = 128       # F of the FRD head
    n_horizons: int = 5
    n_atoms: int = 21
    lr: float = 3e-3
    seed: int = 2033
    sentinel_rows: int = 32  # the last batch leaves horizon h unrealised on its last (h+1)*this rows

    def shapes(self) -> dict[str, tuple[int, ...]]:
        h, d, f, a = self.n_horizons, self.dim, self.hidden, self.n_atoms
        return {"q_h": (h, d), "w_res": (h, d), "bias_res": (h,), "alpha": (h,),
                "w1": (f, d), "b1": (f,), "w2": (h, a, f), "b2": (h, a)}


def init_params(rng: np.random.Generator, cfg: Config, scale: float = 1.0,
                alpha: float = 0.0) -> dict[str, np.ndarray]:
    """Fan-in scaled normal weights times ``scale``; the gate's alpha at ``alpha`` (0: closed)."""
    out = {}
    for name, shape in cfg.shapes().items():
        w = rng.standard_normal(shape) / np.sqrt(shape[-1] if len(shape) > 1 else 1)
        out[name] = (np.full(shape, alpha) if name == "alpha" else w * scale).astype(F32)
    return out


def teacher(cfg: Config) -> dict[str, np.ndarray]:
    """The fixed random teacher: an open gate and larger weights than the student's start."""
    return init_params(np.random.default_rng([cfg.seed, 1]), cfg, scale=2.0, alpha=1.0)


def batch(cfg: Config, teach: dict[str, np.ndarray], step: int) -> dict[str, np.ndarray]:
    """Step ``step``'s data (a fixed seed per step): ln, h_t, base, the target y, labels."""
    rng = np.random.default_rng([cfg.seed, 2, step])
    b, h = cfg.batch, cfg.n_horizons
    ln = rng.standard_normal((b, cfg.seq, cfg.dim), dtype=F32)
    h_t = np.ascontiguousarray(ln[:, -1])
    base = rng.standard_normal((b, h), dtype=F32)
    ctx, _ = ref.pool_forward(teach["q_h"], ln)
    y = ref.gate_forward(base, ref.residual_forward(ctx, teach["w_res"], teach["bias_res"]),
                         teach["alpha"])
    logits = ref.frdhead_forward(h_t, *(teach[n] for n in ("w1", "b1", "w2", "b2")))[1]
    labels = logits.argmax(axis=-1).astype(np.int32)
    if step == cfg.steps - 1:
        for hz in range(h):
            labels[max(0, b - (hz + 1) * cfg.sentinel_rows):, hz] = -1
    return {"ln": ln, "h_t": h_t, "base": base, "y": y.astype(F32), "labels": labels}


class Kernels:
    """The model's steps in float64 NumPy (the references), as ``train_step`` calls them."""

    def __init__(self, cfg: Config):
        self.dev, self.host = (lambda x: np.asarray(x, np.float64)), (lambda x: x)
        self.pool_forward = ref.pool_forward
        self.pool_backward = lambda q_h, ln, attn, grad_ctx, ctx=None: ref.pool_backward(
            q_h, ln, attn, grad_ctx)
        self.residual_forward, self.residual_backward = ref.residual_forward, ref.residual_backward
        self.gate_forward, self.gate_backward = ref.gate_forward, ref.gate_backward
        self.head_forward, self.grad_w2, self.grad_w1 = (
            ref.frdhead_forward, ref.frdhead_grad_w2, ref.frdhead_grad_w1)
        self.softmax_ce_grad = ref.frd_softmax_ce_grad
        self.adam: Callable[..., Any] = lambda p, g, m, v, t: ref.adam_step(p, g, m, v, t,
                                                                           lr=cfg.lr)


def train_step(k: Kernels, state: dict[str, dict[str, Any]], data: dict[str, np.ndarray],
               t: int) -> float:
    """Forward, loss, backward and an Adam step of every parameter (``state``: param, m, v by
    name, updated); the step's loss in float64."""
    p = state["param"]
    ln, h_t, base, y = (k.dev(data[n]) for n in ("ln", "h_t", "base", "y"))
    b, h = data["base"].shape
    ctx, attn = k.pool_forward(p["q_h"], ln)
    residual = k.residual_forward(ctx, p["w_res"], p["bias_res"])
    diff = k.gate_forward(base, residual, p["alpha"]) - y
    hidden, logits = k.head_forward(h_t, p["w1"], p["b1"], p["w2"], p["b2"])
    grad_logits, ce = k.softmax_ce_grad(logits, data["labels"])

    _, grad_residual, g_alpha = k.gate_backward(residual, p["alpha"], diff * F32(2 / (b * h)))
    g_wres, g_bres, grad_ctx = k.residual_backward(ctx, p["w_res"], grad_residual)
    g_q, _ = k.pool_backward(p["q_h"], ln, attn, grad_ctx, ctx=ctx)
    g_w2, g_b2, dhidden = k.grad_w2(hidden, p["w2"], grad_logits * F32(LAMBDA_FRD))
    g_w1, g_b1, _ = k.grad_w1(h_t, p["w1"], hidden, dhidden)
    grads = {"q_h": g_q, "w_res": g_wres, "bias_res": g_bres, "alpha": g_alpha, "w1": g_w1,
             "b1": g_b1, "w2": g_w2, "b2": g_b2}
    for name, g in grads.items():
        p[name], state["m"][name], state["v"][name] = k.adam(p[name], g, state["m"][name],
                                                             state["v"][name], t)
    mse = float(np.mean(np.square(k.host(diff).astype(np.float64))))
    return mse + LAMBDA_FRD * float(k.host(ce).astype(np.float64).sum()) / b


def train(cfg: Config, k: Kernels, steps: int, snapshot_at: int | None = None
          ) -> tuple[list[float], dict[str, np.ndarray], dict[str, np.ndarray] | None]:
    """``steps`` float64 steps from the seeded initial parameters: the losses, the final
    parameters and (with ``snapshot_at``) the parameters after that many steps, else None."""
    teach = teacher(cfg)
    init = init_params(np.random.default_rng([cfg.seed, 0]), cfg)
    state = {"param": {n: k.dev(v) for n, v in init.items()},
             "m": {n: k.dev(np.zeros_like(v)) for n, v in init.items()},
             "v": {n: k.dev(np.zeros_like(v)) for n, v in init.items()}}
    losses, snapshot = [], None
    for s in range(steps):
        losses.append(train_step(k, state, batch(cfg, teach, s), s + 1))
        if s + 1 == snapshot_at:  # a copy: the arrays are the state itself
            snapshot = {n: np.array(v) for n, v in state["param"].items()}
    return losses, dict(state["param"]), snapshot


def gpu_train(cfg: Config, steps: int, graph: bool, snapshot_at: int | None = None
              ) -> tuple[list[float], dict[str, np.ndarray], dict[str, np.ndarray] | None]:
    """``train`` on the GPU through one ``TrainStep``: each step replayed as its CUDA graph
    (``graph``) or launched kernel by kernel. The losses are the device's float32 ones."""
    from .step import TrainStep
    step = TrainStep(cfg.n_horizons, cfg.dim, cfg.batch, cfg.seq, frd_hidden=cfg.hidden,
                     n_atoms=cfg.n_atoms, lr=cfg.lr, frd_weight=LAMBDA_FRD)
    teach = teacher(cfg)
    step.load(init_params(np.random.default_rng([cfg.seed, 0]), cfg))
    losses, snapshot = [], None
    for s in range(steps):
        step.feed(**batch(cfg, teach, s))
        loss = step.replay() if graph else step.run()
        losses.append(float(loss.get()[0]))  # the next feed overwrites the inputs: read now
        if s + 1 == snapshot_at:
            snapshot = {n: a.get() for n, a in step.params.items()}
    return losses, {n: a.get() for n, a in step.params.items()}, snapshot


def _same_bits(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(a[n].tobytes() == b[n].tobytes() for n in a)


def _f32_bits(losses: list[float]) -> bytes:
    return np.array(losses, np.float32).tobytes()


def run(cfg: Config) -> dict[str, Any]:
    """Two graph runs, the first steps launched eagerly, the float64 reference of the first
    steps; the record."""
    start = time.perf_counter()
    ref_steps, eager_steps = min(REFERENCE_STEPS, cfg.steps), min(EAGER_STEPS, cfg.steps)
    losses, params, short = gpu_train(cfg, cfg.steps, graph=True, snapshot_at=ref_steps)
    again, params_again, at_eager = gpu_train(cfg, cfg.steps, graph=True,
                                              snapshot_at=eager_steps)
    eager, eager_params, _ = gpu_train(cfg, eager_steps, graph=False)
    ref_losses, ref_params, _ = train(cfg, Kernels(cfg), ref_steps)
    ref_err = max(abs(a - r) / abs(r) for a, r in zip(losses, ref_losses))
    # Parameters after the reference steps, for the record: Adam moves an entry by about lr
    # whatever its gradient's size, so an entry whose gradient is at float32 rounding level can
    # differ by lr; the criterion is the losses, which a wrong gradient moves far beyond 1e-4.
    param_err = {n: float(np.linalg.norm(short[n] - v) / max(np.linalg.norm(v), 1e-30))
                 for n, v in ref_params.items()}
    bitwise = _f32_bits(losses) == _f32_bits(again) and _same_bits(params, params_again)
    graph_eager = (_f32_bits(again[:eager_steps]) == _f32_bits(eager)
                   and _same_bits(at_eager, eager_params))
    return {"loss_first": losses[0], "loss_last": losses[-1],
            "nan": bool(not np.isfinite(losses).all()
                        or not all(np.isfinite(v).all() for v in params.values())),
            "bitwise_rerun": bool(bitwise), "graph_eager_bitwise": bool(graph_eager),
            "reference_match": bool(ref_err <= REFERENCE_RTOL), "path": "cuda_graph",
            "steps": cfg.steps, "reference_steps": ref_steps,
            "reference_max_rel_err": ref_err, "reference_losses": ref_losses,
            "reference_param_rel_err": param_err, "eager_steps": eager_steps,
            "graph_losses_first": again[:eager_steps], "eager_losses": eager,
            "alpha_last": [float(a) for a in params["alpha"]], "losses": losses,
            "lambda_frd": LAMBDA_FRD, "config": cfg.__dict__,
            "seconds": round(time.perf_counter() - start, 1)}


def passed(result: dict[str, Any]) -> bool:
    """The acceptance: the loss halves, no NaN, bitwise reruns, the graph bitwise the eager
    steps, float64 agreement, alpha open."""
    return bool(result["loss_last"] <= 0.5 * result["loss_first"] and not result["nan"]
                and result["bitwise_rerun"] and result["graph_eager_bitwise"]
                and result["reference_match"]
                and max(abs(a) for a in result["alpha_last"]) > 1e-3)


_positive = records.int_at_least(1)


def register(sub: Any) -> None:
    p = sub.add_parser("smoke", help="one epoch of training on teacher data (GPU); writes "
                                     "reports/<gpu>/smoke_training.json",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=_positive, default=Config.steps, help="steps of the epoch")
    p.add_argument("--out", type=Path, default=Path("reports"), help="the reports folder")
    p.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    from .core import device
    device.cuda()  # before any work; main reports a missing GPU in one line
    result = run(Config(steps=args.steps))
    result.update(gpu=device.gpu_name(), commit=records.git_state()["describe"],
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  passed=passed(result))
    path = Path(args.out) / device.gpu_slug() / records.SMOKE_JSON
    records.write_json(path, result)
    print(f"loss {result['loss_first']:.4f} -> {result['loss_last']:.4f} in {result['steps']} "
          f"steps (CUDA graph), nan {result['nan']}, bitwise rerun {result['bitwise_rerun']}, "
          f"graph = eager bitwise {result['graph_eager_bitwise']}, float64 match "
          f"{result['reference_match']} ({result['reference_max_rel_err']:.1e}), alpha "
          f"{result['alpha_last']}, {result['seconds']} s: {'PASS' if result['passed'] else 'FAIL'}")
    print(f"wrote {path}")
    return 0 if result["passed"] else 1
