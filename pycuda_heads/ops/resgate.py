"""The per-horizon residual and the alpha gate fused (cu/resgate.cu):
residual[b,h] = w_res[h,:] . ctx[b,h,:] + bias_res[h] and out = head + tanh(alpha) * residual,
forward in one kernel, backward in one kernel plus one reduce (none with a single row group)."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from .. import reference as ref
from ..core.arrays import Inputs, check_aligned, empty_parts, output_buffer, split
from ..core.op import HorizonOp
from ..core.space import KernelSpace, by_role, residual_pairs_space
from ..core.spec import KernelSpec, Tensor, uniform2
from .reduce import reducer


FORWARD_SPACE = residual_pairs_space("resgate.forward")

# BLOCK * VEC columns per strip: BLOCK=32/VEC=4 or 64/VEC=2 cut a 5 x 128 row into 5 full strips.
BACKWARD_SPACE = KernelSpace(
    kernel="resgate.backward",
    params={"BLOCK": (32, 64, 128, 256), "ROWS": (1, 4, 16, 64, 256), "VEC": (1, 2, 4),
            "UNROLL": (1, 2, 4, 8)},
    default={"BLOCK": 64, "ROWS": 16, "VEC": 2, "UNROLL": 4},
    restrictions=("HIDDEN_DIM % VEC == 0", "UNROLL <= ROWS"),
)

FORWARD_INPUTS = Inputs(ctx=("B", "H", "D"), w_res=("H", "D"), bias_res=("H",),
                        head=("B", "H"), alpha=("H",))
BACKWARD_INPUTS = Inputs(ctx=("B", "H", "D"), w_res=("H", "D"), alpha=("H",),
                         residual=("B", "H"), grad_out=("B", "H"))


class ResidualGate(HorizonOp):
    """out, residual = rg.forward(ctx, w_res, bias_res, head, alpha);
    grad_w_res, grad_bias_res, grad_ctx, grad_head, grad_alpha =
        rg.backward(ctx, w_res, alpha, residual, grad_out).

    The backward takes the forward's saved ``residual`` (B*H floats, against the B*H*D of ctx it
    reads anyway) instead of recomputing it, which would need bias_res and a dot product per
    (b, h) across the threads that split each row.
    """

    FAMILY = "resgate"
    PDL = True
    SPACES = by_role(FORWARD_SPACE, BACKWARD_SPACE)

    def forward(self, ctx: Any, w_res: Any, bias_res: Any, head: Any, alpha: Any, *,
                stream: Any = None) -> tuple[Any, Any]:
        """out[B, H] and residual[B, H] (for the backward) as GPUArrays."""
        (ctx, w_res, bias_res, head, alpha), dims = FORWARD_INPUTS.adapt(
            self._checked, self.bound, ctx, w_res, bias_res, head, alpha)
        b = dims["B"]
        plan = self.plan("forward", {"B": b}, lambda p: (
            (-(-b // p["ROWS"]), 1, 1), (p["BLOCK"], 1, 1), 0))
        check_aligned(plan.params["VEC"], ctx=ctx, w_res=w_res)
        out, residual = empty_parts((b, self.n_horizons), (b, self.n_horizons))
        plan.kernel(plan.grid, plan.block, ctx=ctx.gpudata, w_res=w_res.gpudata,
                    bias_res=bias_res.gpudata, head=head.gpudata, alpha=alpha.gpudata,
                    out=out.gpudata, residual=residual.gpudata, B=b, stream=stream)
        return out, residual

    def backward(self, ctx: Any, w_res: Any, alpha: Any, residual: Any, grad_out: Any, *,
                 out: Any = None, accumulate: bool = False,
                 stream: Any = None) -> tuple[Any, Any, Any, Any, Any]:
        """grad_w_res[H, D], grad_bias_res[H], grad_ctx[B, H, D], grad_head[B, H] (grad_out
        itself: the gate passes it through) and grad_alpha[H].

        ``out`` (a device array [B, H, D]) receives grad_ctx in place; with ``accumulate=True``
        the gradient is added to what ``out`` holds (the pool backward's grad_ctx input).
        grad_w_res, grad_bias_res and grad_alpha are views of one device row.
        """
        (ctx, w_res, alpha, residual, grad_out), dims = BACKWARD_INPUTS.adapt(
            self._checked, self.bound, ctx, w_res, alpha, residual, grad_out)
        b, h, d = dims["B"], dims["H"], dims["D"]
        plan = self.plan("backward", {"B": b}, lambda p: (
            (-(-b // p["ROWS"]), -(-h * d // (p["BLOCK"] * p["VEC"])), 1),
            (p["BLOCK"], 1, 1), 0))
        groups, cols = plan.grid[0], h * d + 2 * h
        grads = ((h, d), (h,), (h,))  # a scratch row: grad_w_res | grad_bias_res | grad_alpha
        # With one row group its row is the final sum: the gradients themselves, carved back to
        # back, and no reduce launch (what keeps small B fast).
        rows = (groups, cols) if groups > 1 else None
        parts = (rows,) if rows else grads
        if out is None and not accumulate:  # grad_ctx and the scratch from one pool call
            out, *scratch = empty_parts((b, h, d), *parts, align=4)
        else:
            out = output_buffer(out, accumulate, "grad_ctx", ("B", "H", "D"), dims)
            scratch = empty_parts(*parts, align=4)
        check_aligned(plan.params["VEC"], ctx=ctx, w_res=w_res, out=out)
        plan.kernel(plan.grid, plan.block, ctx=ctx.gpudata, w_res=w_res.gpudata,
                    alpha=alpha.gpudata, residual=residual.gpudata, grad_out=grad_out.gpudata,
                    scratch=scratch[0].gpudata, grad_ctx=out.gpudata, B=b,
                    accumulate=1 if accumulate else 0, stream=stream)
        if rows:
            scratch = split(reducer().sum_rows(scratch[0], groups, cols, stream), *grads)
        grad_w_res, grad_bias_res, grad_alpha = scratch
        return grad_w_res, grad_bias_res, out, grad_out, grad_alpha


def torch_forward(torch: Any, ctx: Any, w_res: Any, bias_res: Any, head: Any,
                  alpha: Any) -> tuple[Any, Any]:
    residual = torch.einsum("bhd,hd->bh", ctx, w_res) + bias_res
    return head + torch.tanh(alpha) * residual, residual


def torch_backward(torch: Any, ctx: Any, w_res: Any, alpha: Any, residual: Any,
                   grad_out: Any) -> tuple[Any, ...]:
    t = torch.tanh(alpha)
    g = t * grad_out
    return (torch.einsum("bh,bhd->hd", g, ctx), g.sum(dim=0), g.unsqueeze(-1) * w_res, grad_out,
            (1 - t * t) * (grad_out * residual).sum(dim=0))


def oracles(make_op: Callable[[Mapping[str, int]], Any], template: Mapping[str, int]) -> dict:
    """Central differences of loss = sum(g * out) at B=3 (8 ctx and 8 w_res entries, every
    bias_res and alpha, 8 head entries) against the backward; a closed gate (alpha = 0) returns
    the head bitwise and sends exactly zero gradient to ctx, w_res and bias_res."""
    h, d, b = template["N_HORIZONS"], template["HIDDEN_DIM"], 3
    rng = np.random.default_rng(2029)
    x = {"ctx": rng.standard_normal((b, h, d), dtype=np.float32),
         "w_res": rng.standard_normal((h, d), dtype=np.float32),
         "bias_res": rng.standard_normal(h, dtype=np.float32),
         "head": rng.standard_normal((b, h), dtype=np.float32),
         "alpha": rng.uniform(-2, 2, h).astype(np.float32)}
    g = rng.standard_normal((b, h), dtype=np.float32)
    rg = make_op(template)

    def loss() -> float:
        out, _ = rg.forward(x["ctx"], x["w_res"], x["bias_res"], x["head"], x["alpha"])
        return float((g * out.get().astype(np.float64)).sum())

    _, residual = rg.forward(x["ctx"], x["w_res"], x["bias_res"], x["head"], x["alpha"])
    gw, gb, gctx, gh, ga = (a.get() for a in rg.backward(x["ctx"], x["w_res"], x["alpha"],
                                                          residual, g))
    analytic = {"ctx": gctx, "w_res": gw, "bias_res": gb, "head": gh, "alpha": ga}
    probes = {"ctx": ref.random_indices(rng, (b, h, d), 8),
              "w_res": ref.random_indices(rng, (h, d), 8),
              "bias_res": [(i,) for i in range(h)], "head": ref.random_indices(rng, (b, h), 8),
              "alpha": [(i,) for i in range(h)]}
    parity = ref.central_differences(loss, x, analytic, probes)

    shut = np.zeros(h, np.float32)
    out, residual = rg.forward(x["ctx"], x["w_res"], x["bias_res"], x["head"], shut)
    gw, gb, gctx, _, _ = (a.get() for a in rg.backward(x["ctx"], x["w_res"], shut, residual, g))
    closed = (out.get().tobytes() == x["head"].tobytes()
              and not gw.any() and not gb.any() and not gctx.any())
    return {"parity_numgrad": parity, "closed_gate_bitwise": {"passed": bool(closed)}}


TENSORS = {"ctx": Tensor(("B", "H", "D")), "w_res": Tensor(("H", "D")),
           "bias_res": Tensor(("H",)), "head": Tensor(("B", "H")),
           "alpha": Tensor(("H",), draw=uniform2), "out": Tensor(("B", "H")),
           "residual": Tensor(("B", "H")), "grad_out": Tensor(("B", "H")),
           "grad_w_res": Tensor(("H", "D")), "grad_bias_res": Tensor(("H",)),
           "grad_ctx": Tensor(("B", "H", "D")), "grad_head": Tensor(("B", "H")),
           "grad_alpha": Tensor(("H",))}
SUITE = ({"B": 3}, {"B": 4096}, {"B": 65536})
# B=1000: several row groups through the reduce; D=30: no vector loads wider than 2; H=1;
# D=1 with 3 horizons: strips that hold several horizons' single columns.
GRID = (({}, {"B": 1}), ({}, {"B": 7}), ({}, {"B": 1000}), ({"N_HORIZONS": 1}, {"B": 5}),
        ({"HIDDEN_DIM": 30}, {"B": 50}), ({"HIDDEN_DIM": 256}, {"B": 9}),
        ({"N_HORIZONS": 3, "HIDDEN_DIM": 1}, {"B": 40}))
_COMMON_SPEC = dict(op=ResidualGate, template_keys=("N_HORIZONS", "HIDDEN_DIM"),
                    tensors=TENSORS, suite=SUITE, grid=GRID, oracles=oracles)

SPECS = (
    KernelSpec(method="forward", space=FORWARD_SPACE,
               reads=("ctx", "w_res", "bias_res", "head", "alpha"), writes=("out", "residual"),
               reference=ref.resgate_forward, peer=torch_forward, **_COMMON_SPEC),
    # grad_head is grad_out itself: the gate passes it through unchanged.
    KernelSpec(method="backward", space=BACKWARD_SPACE,
               reads=("ctx", "w_res", "alpha", "residual", "grad_out"),
               writes=("grad_w_res", "grad_bias_res", "grad_ctx", "grad_head", "grad_alpha"),
               passthrough={"grad_head": "grad_out"}, reference=ref.resgate_backward,
               peer=torch_backward, **_COMMON_SPEC),
)
