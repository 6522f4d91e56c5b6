"""Training steps as one unit, into buffers the step owns, on one stream: ``HeadStep`` (the
attention pool and the fused residual + gate, forward and backward) and ``TrainStep`` (the whole
model the smoke training trains: pool, residual + gate and the FRD head forward, the loss, the
backward of both branches and one multi-tensor Adam step). Because nothing moves between
steps, a step can be captured as a CUDA graph and replayed with a single launch, which is what
small batches need: there the GPU work is a few microseconds and the host's launches are the
cost."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .core.arrays import Arena, as_device, check_shape, empty, empty_parts, memory_from
from .core.device import cuda
from .core.graph import Graph
from .core.runtime import scoped
from .ops.frd import FrdSoftmaxCE
from .ops.frdhead import FrdHead
from .ops.frdsmall import FrdHeadSmall
from .ops.headloss import FRD_WEIGHT, HeadLoss
from .ops.multiadam import AdamSchedule, MultiAdam
from .ops.pool import PerHorizonAttentionPool
from .ops.resgate import ResidualGate

__all__ = ["DATA", "FRD_WEIGHT", "INPUTS", "PARAMS", "HeadStep", "TrainStep", "frd_head"]

#: what the step reads, with named axes (B batch, K sequence, H horizons, D hidden)
INPUTS = {"q_h": ("H", "D"), "ln": ("B", "K", "D"), "w_res": ("H", "D"), "bias_res": ("H",),
          "head": ("B", "H"), "alpha": ("H",), "grad_out": ("B", "H")}


def _positive(owner: str, **sizes: Any) -> None:
    for name, n in sizes.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{owner}: {name} must be a positive int, got {n!r}")


def _launch_keys(owner: str, launch: Mapping[str, Any] | None, known: tuple[str, ...]) -> dict:
    launch = dict(launch or {})
    unknown = set(launch) - set(known)
    if unknown:
        raise ValueError(f"{owner}: launch= has unknown ops {sorted(unknown)}; expected keys "
                         f"among {sorted(known)}")
    return launch


class _Captured:
    """What both steps share: the first pass fixes where every buffer lives (an ``Arena``),
    later passes launch into the same addresses eagerly (``_run``) or as a captured CUDA graph
    (``_replay``). A subclass calls ``_start`` and writes ``_launch(stream) -> outputs``."""

    def _start(self, stream: Any) -> None:
        self.stream = stream if stream is not None else cuda().Stream()
        self.outputs: dict[str, Any] = {}
        self._arena = Arena()
        self._graph: Graph | None = None

    def _measure(self) -> None:
        """The measuring pass: its allocations fix the layout of the step's buffers, reserved
        after a synchronisation of the stream."""
        with memory_from(self._arena):
            self._launch(self.stream)
        self.stream.synchronize()
        self._arena.reserve()

    def _run(self) -> dict[str, Any]:
        if self._arena.measuring:
            self._measure()
        with memory_from(self._arena):
            self.outputs = self._launch(self.stream)
        return self.outputs

    def capture(self) -> None:
        """Record the step as a CUDA graph. A step that never ran first takes its measuring
        pass, then one pass with its launches recorded but not made (the ops work out their
        launch plans and device tables at the buffers' addresses), so capturing changes no
        state. A failed capture raises and leaves the eager path as it was."""
        if self._arena.measuring:
            self._measure()
            with memory_from(self._arena), scoped(recording=[], dry=True):
                self.outputs = self._launch(self.stream)
        with memory_from(self._arena):
            self._graph = Graph(lambda s: self.outputs.update(self._launch(s)), self.stream)

    def _replay(self) -> dict[str, Any]:
        if self._graph is None:
            self.capture()
        self._graph.launch(self.stream)
        return self.outputs

    def synchronize(self) -> None:
        self.stream.synchronize()


class HeadStep(_Captured):
    """One forward + backward step of pool -> residual + gate at a fixed shape.

    Fill ``inputs`` (GPUArrays the step owns; ``grad_out`` is the gradient of the loss with
    respect to the gated output), then ``run()`` launches every kernel on ``stream``, or
    ``replay()`` launches the captured CUDA graph of the same step (captured on first use).
    ``outputs`` holds ctx, attn, residual, out and the gradient of every input; its buffers are
    the same from step to step, overwritten by each.
    """

    def __init__(self, n_horizons: int, hidden_dim: int, batch: int, seq_len: int, *,
                 stream: Any = None, launch: Mapping[str, Any] | None = None) -> None:
        launch = _launch_keys("HeadStep", launch, ("pool", "resgate"))
        _positive("HeadStep", batch=batch, seq_len=seq_len)
        self.pool = PerHorizonAttentionPool(n_horizons, hidden_dim, launch=launch.get("pool"))
        self.resgate = ResidualGate(n_horizons, hidden_dim, launch=launch.get("resgate"))
        dims = {"B": batch, "K": seq_len, "H": n_horizons, "D": hidden_dim}
        self.inputs = {name: empty(tuple(dims[a] for a in axes))
                       for name, axes in INPUTS.items()}
        self._start(stream)

    def run(self) -> dict[str, Any]:
        """Launch the step's kernels one by one on the stream; returns without waiting for them.

        The first run launches the step twice: a measuring pass, whose allocations fix the
        layout of the step's buffers, then (after a synchronisation of the stream and the
        reservation of those buffers) the real pass into them, whose outputs it returns. Later
        runs launch once and never synchronise."""
        return self._run()

    def replay(self) -> dict[str, Any]:
        """The whole step with one launch of its CUDA graph (captured on first use)."""
        return self._replay()

    def _launch(self, s: Any) -> dict[str, Any]:
        x = self.inputs
        ctx, attn = self.pool.forward(x["q_h"], x["ln"], stream=s)
        out, residual = self.resgate.forward(ctx, x["w_res"], x["bias_res"], x["head"],
                                             x["alpha"], stream=s)
        grad_w_res, grad_bias_res, grad_ctx, grad_head, grad_alpha = self.resgate.backward(
            ctx, x["w_res"], x["alpha"], residual, x["grad_out"], stream=s)
        grad_q_h, grad_ln = self.pool.backward(x["q_h"], x["ln"], attn, grad_ctx, ctx=ctx,
                                               stream=s)
        return {"ctx": ctx, "attn": attn, "residual": residual, "out": out,
                "grad_head": grad_head, "grad_alpha": grad_alpha, "grad_w_res": grad_w_res,
                "grad_bias_res": grad_bias_res, "grad_ctx": grad_ctx, "grad_q_h": grad_q_h,
                "grad_ln": grad_ln}


#: the trained parameters, with named axes (F the FRD head's hidden units, A its atoms)
PARAMS = {"q_h": ("H", "D"), "w_res": ("H", "D"), "bias_res": ("H",), "alpha": ("H",),
          "w1": ("F", "D"), "b1": ("F",), "w2": ("H", "A", "F"), "b2": ("H", "A")}
#: a step's data: the sequence, the FRD head's input, the base output the gate adds to, the
#: target of the gated output and the FRD labels (int32, -1: a return not realised yet)
DATA = {"ln": ("B", "K", "D"), "h_t": ("B", "D"), "base": ("B", "H"), "y": ("B", "H"),
        "labels": ("B", "H")}
_INT_DATA = {"labels"}
TRAIN_OPS = ("pool", "resgate", "frdhead", "frdsmall", "headloss", "multiadam")
#: batches at or below which the step runs the FRD head's small-batch kernels (``FrdHeadSmall``,
#: when D and F are at most 1024): fwd+bwd on the H200 at B = 1024, 38.9 us against FrdHead's
#: 84.1 (both tuned), and a fraction of its time below
SMALL_BATCH = 1024


def frd_head(batch: int, d_in: int, hidden: int) -> type[FrdHead]:
    """The FRD head's op class for a batch: ``FrdHeadSmall`` at B <= ``SMALL_BATCH`` with D_in
    and F at most 1024 (the same head, its small-batch kernels), else ``FrdHead``."""
    return FrdHeadSmall if batch <= SMALL_BATCH and max(d_in, hidden) <= 1024 else FrdHead


class TrainStep(_Captured):
    """One training step of the whole head at a fixed shape, capturable as one CUDA graph.

    The model: ln -> attention pool -> residual + alpha gate added to ``base``; h_t -> FRD head
    -> softmax-CE against ``labels``; loss = mean (out - y)^2 + frd_weight * sum(ce) / B
    (``HeadLoss``). A step runs the forward, the loss, the backward of both branches (the
    FRD head's F.3b and F.3c, residual + gate, pool) and one Adam step of the eight parameters
    with one multi-tensor launch. The step owns its parameters (``params``), their Adam moments,
    its step counter and learning rate (on the device: ``schedule``) and every buffer. The FRD
    branch runs on a second stream of the step's, beside the pool branch: its forward and
    softmax-CE beside the pool and residual/gate forward, then the loss, then its backward
    stages beside theirs; it joins before Adam, so ``stream`` waits for all of it.

    ``load(params)`` sets the parameters (moments zero, step 0); ``feed(**data)`` fills the
    inputs in place; ``run()`` launches the step's kernels one by one, ``replay()`` the
    captured graph (captured on first use). Both return the loss, a device array [1], without
    a synchronisation; a replay needs no argument from the host.

    ``launch`` maps an op family of ``TRAIN_OPS`` to its kernels' launch parameters. The FRD
    head is ``FrdHeadSmall`` (key ``frdsmall``) at B <= ``SMALL_BATCH``, else ``FrdHead`` (key
    ``frdhead``); the other key's entry is not used. The FRD forward and softmax-CE are the
    head's one ``forward_loss`` launch.
    """

    def __init__(self, n_horizons: int, hidden_dim: int, batch: int, seq_len: int, *,
                 frd_hidden: int = 128, n_atoms: int = 21, lr: float = 1e-3,
                 frd_weight: float = FRD_WEIGHT, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, stream: Any = None,
                 launch: Mapping[str, Any] | None = None) -> None:
        launch = _launch_keys("TrainStep", launch, TRAIN_OPS)
        _positive("TrainStep", batch=batch, seq_len=seq_len)
        self.pool = PerHorizonAttentionPool(n_horizons, hidden_dim, launch=launch.get("pool"))
        self.resgate = ResidualGate(n_horizons, hidden_dim, launch=launch.get("resgate"))
        head = frd_head(batch, hidden_dim, frd_hidden)
        self.head = head(hidden_dim, frd_hidden, n_horizons, n_atoms,
                         launch=launch.get(head.FAMILY))
        self.frd = FrdSoftmaxCE(n_horizons, n_atoms)  # its host label check (``feed``)
        self.loss = HeadLoss(n_horizons, n_atoms, frd_weight, launch=launch.get("headloss"))
        self.adam = MultiAdam(lr, *betas, eps, launch=launch.get("multiadam"))
        self.dims = {"B": batch, "K": seq_len, "H": n_horizons, "D": hidden_dim,
                     "F": frd_hidden, "A": n_atoms}
        shapes = [self._shape(axes) for axes in PARAMS.values()]
        self.params, self.m, self.v = ({n: a for n, a in zip(PARAMS, empty_parts(*shapes))}
                                       for _ in range(3))
        self.inputs = {n: empty(self._shape(axes), np.int32 if n in _INT_DATA else np.float32)
                       for n, axes in DATA.items()}
        self.schedule = AdamSchedule(lr)
        # the FRD branch runs on a stream of its own: forked at the start, handed the gated
        # output for the loss, handing back grad_out, joined before Adam (a graph holds the two
        # branches side by side)
        drv = cuda()
        self._side = drv.Stream()
        self._events = {name: drv.Event(drv.event_flags.DISABLE_TIMING)
                        for name in ("fork", "out", "loss", "join")}
        self._loaded = False
        self._start(stream)

    def _shape(self, axes: tuple[str, ...]) -> tuple[int, ...]:
        return tuple(self.dims[a] for a in axes)

    def load(self, params: Mapping[str, Any]) -> None:
        """Set every parameter (arrays by name, as ``PARAMS`` shapes them), zero the Adam
        moments and start again at step 0. Checked in full before anything is copied."""
        self._put(params, PARAMS, self.params, "params")
        for moments in (self.m, self.v):
            for arr in moments.values():
                arr.fill(np.float32(0))
        self.schedule.reset(self.adam.lr)
        self._loaded = True

    def feed(self, **data: Any) -> None:
        """Fill the step's inputs by name (``DATA``; NumPy arrays are copied, device arrays
        copied on the step's stream). Host labels outside [-1, n_atoms) raise; device labels
        are not read (a bad one makes its row's loss NaN)."""
        if "labels" in data and isinstance(data["labels"], np.ndarray):
            self.frd._check_labels(data["labels"])  # the op's own check, before any copy
        self._put(data, DATA, self.inputs, "data")

    def _put(self, arrays: Mapping[str, Any], axes_of: Mapping[str, tuple[str, ...]],
             into: Mapping[str, Any], what: str) -> None:
        unknown = sorted(set(arrays) - set(axes_of))
        if unknown:
            raise ValueError(f"TrainStep: unknown {what} {unknown}; expected names among "
                             f"{sorted(axes_of)}")
        missing = sorted(set(axes_of) - set(arrays)) if what == "params" else []
        if missing:
            raise ValueError(f"TrainStep: params lacks {missing}; load takes every parameter")
        checked = []
        for name, x in arrays.items():
            dtype = np.int32 if name in _INT_DATA else np.float32
            dims = dict(self.dims)
            if isinstance(x, np.ndarray):
                if x.dtype != dtype:
                    raise TypeError(f"{name}: expected dtype {np.dtype(dtype)}, got {x.dtype}")
                check_shape(name, x.shape, axes_of[name], dims)
            else:
                x = as_device(x, name, axes_of[name], dims, dtype)
            checked.append((into[name], x))
        for dst, src in checked:
            if isinstance(src, np.ndarray):
                dst.set(np.ascontiguousarray(src))
            else:
                cuda().memcpy_dtod_async(dst.gpudata, src.gpudata, dst.nbytes, self.stream)

    def run(self) -> Any:
        """The step's kernels launched one by one on the stream: the loss [1] (a device array
        the next step overwrites), without waiting. The first run also takes the measuring
        pass that fixes the buffers (it synchronises once and updates nothing)."""
        self._check_loaded()
        return self._run()["loss"]

    def replay(self) -> Any:
        """The whole step with one launch of its CUDA graph (captured on first use): the loss."""
        self._check_loaded()
        return self._replay()["loss"]

    @property
    def t(self) -> int:
        """Steps taken since ``load`` (reads the device: synchronises)."""
        return self.schedule.t

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next steps, on the device (a replay reads it there)."""
        self.schedule.set_lr(lr)

    def _hand(self, src: Any, dst: Any, event: str) -> None:
        """``dst`` waits for what ``src`` has launched so far."""
        self._events[event].record(src)
        dst.wait_for_event(self._events[event])

    def _check_loaded(self) -> None:
        if not self._loaded:
            raise RuntimeError("TrainStep: load(params) before the first step")

    def _launch(self, s: Any) -> dict[str, Any]:
        x, p, side = self.inputs, self.params, self._side
        self._hand(s, side, "fork")
        hidden, logits, grad_logits, ce = self.head.forward_loss(
            x["h_t"], p["w1"], p["b1"], p["w2"], p["b2"], x["labels"], stream=side)
        ctx, attn = self.pool.forward(p["q_h"], x["ln"], stream=s)
        out, residual = self.resgate.forward(ctx, p["w_res"], p["bias_res"], x["base"],
                                             p["alpha"], stream=s)
        # the loss goes on the FRD branch's stream: at small batches its forward ends after the
        # pool branch's, so the loss waits across streams only for a gated output long ready
        self._hand(s, side, "out")
        grad_out, grad_logits_w, loss = self.loss.grad(out, x["y"], ce, grad_logits,
                                                       stream=side)
        self._hand(side, s, "loss")
        g_w2, g_b2, dhidden = self.head.grad_w2(hidden, p["w2"], grad_logits_w, stream=side)
        g_w1, g_b1, _ = self.head.grad_w1(x["h_t"], p["w1"], hidden, dhidden, stream=side)
        g_wres, g_bres, grad_ctx, _, g_alpha = self.resgate.backward(
            ctx, p["w_res"], p["alpha"], residual, grad_out, stream=s)
        g_q, _ = self.pool.backward(p["q_h"], x["ln"], attn, grad_ctx, ctx=ctx, stream=s)
        self._hand(side, s, "join")
        grads = {"q_h": g_q, "w_res": g_wres, "bias_res": g_bres, "alpha": g_alpha,
                 "w1": g_w1, "b1": g_b1, "w2": g_w2, "b2": g_b2}
        if not self._arena.measuring:  # the measuring pass updates nothing
            self.adam.step_scheduled(list(p.values()), [grads[n] for n in p],
                                     list(self.m.values()), list(self.v.values()),
                                     self.schedule, stream=s)
        return {"loss": loss, "out": out, "logits": logits, "ce": ce,
                **{f"grad_{n}": g for n, g in grads.items()}}
