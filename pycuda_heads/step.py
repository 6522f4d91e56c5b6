"""The head's training step as one unit: the attention pool and the fused residual + gate
forward, then the backward chain residual+gate -> pool, into buffers the step owns, on one
stream. Because nothing moves between steps, the whole step can be captured as a CUDA graph and
replayed with a single launch, which is what small batches need: there the GPU work is a few
microseconds and the host's launches are the cost."""
from __future__ import annotations

from typing import Any, Mapping

from .core.arrays import Arena, empty, memory_from
from .core.device import cuda
from .core.graph import Graph
from .ops.pool import PerHorizonAttentionPool
from .ops.resgate import ResidualGate

#: what the step reads, with named axes (B batch, K sequence, H horizons, D hidden)
INPUTS = {"q_h": ("H", "D"), "ln": ("B", "K", "D"), "w_res": ("H", "D"), "bias_res": ("H",),
          "head": ("B", "H"), "alpha": ("H",), "grad_out": ("B", "H")}


class HeadStep:
    """One forward + backward step of pool -> residual + gate at a fixed shape.

    Fill ``inputs`` (GPUArrays the step owns; ``grad_out`` is the gradient of the loss with
    respect to the gated output), then ``run()`` launches every kernel on ``stream``, or
    ``replay()`` launches the captured CUDA graph of the same step (captured on first use).
    ``outputs`` holds ctx, attn, residual, out and the gradient of every input; its buffers are
    the same from step to step, overwritten by each.
    """

    def __init__(self, n_horizons: int, hidden_dim: int, batch: int, seq_len: int, *,
                 stream: Any = None, launch: Mapping[str, Any] | None = None) -> None:
        launch = dict(launch or {})
        unknown = set(launch) - {"pool", "resgate"}
        if unknown:
            raise ValueError(f"HeadStep: launch= has unknown ops {sorted(unknown)}; expected "
                             f"keys among ['pool', 'resgate']")
        for name, n in (("batch", batch), ("seq_len", seq_len)):
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"HeadStep: {name} must be a positive int, got {n!r}")
        self.pool = PerHorizonAttentionPool(n_horizons, hidden_dim, launch=launch.get("pool"))
        self.resgate = ResidualGate(n_horizons, hidden_dim, launch=launch.get("resgate"))
        dims = {"B": batch, "K": seq_len, "H": n_horizons, "D": hidden_dim}
        self.inputs = {name: empty(tuple(dims[a] for a in axes))
                       for name, axes in INPUTS.items()}
        self.stream = stream if stream is not None else cuda().Stream()
        self.outputs: dict[str, Any] = {}
        self._arena = Arena()
        self._graph: Graph | None = None

    def run(self) -> dict[str, Any]:
        """Launch the step's kernels one by one on the stream; returns without waiting for them.

        The first run launches the step twice: a measuring pass, whose allocations fix the
        layout of the step's buffers, then (after a synchronisation of the stream and the
        reservation of those buffers) the real pass into them, whose outputs it returns. Later
        runs launch once and never synchronise."""
        if self._arena.measuring:  # the first step fixes where every buffer lives
            with memory_from(self._arena):
                self._launch(self.stream)
            self.stream.synchronize()
            self._arena.reserve()
        with memory_from(self._arena):
            self.outputs = self._launch(self.stream)
        return self.outputs

    def capture(self) -> None:
        """Record the step as a CUDA graph (the buffers are fixed by a first eager step, whose
        real pass may still be running: capture only records, it does not wait for it)."""
        if self._arena.measuring:
            self.run()
        with memory_from(self._arena):
            self._graph = Graph(lambda s: self.outputs.update(self._launch(s)), self.stream)

    def replay(self) -> dict[str, Any]:
        """The whole step with one launch of its CUDA graph (captured on first use)."""
        if self._graph is None:
            self.capture()
        self._graph.launch(self.stream)
        return self.outputs

    def synchronize(self) -> None:
        self.stream.synchronize()

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
