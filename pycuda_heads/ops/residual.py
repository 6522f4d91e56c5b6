"""Per-horizon residual projection (cu/residual.cu):
residual[b,h] = w_res[h,:] . ctx[b,h,:] + bias_res[h]."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from .. import reference as ref
from ..core.arrays import Inputs, check_aligned, empty, output_buffer
from ..core.op import HorizonOp
from ..core.space import KernelSpace, by_role, residual_pairs_space
from ..core.spec import KernelSpec, Tensor
from .reduce import reducer

FORWARD_SPACE = residual_pairs_space("residual.forward")

BACKWARD_SPACE = KernelSpace(
    kernel="residual.backward",
    params={"BLOCK": (64, 128, 256, 512, 1024), "ROWS": (1, 4, 16, 64, 256), "VEC": (1, 2, 4)},
    default={"BLOCK": 128, "ROWS": 16, "VEC": 4},
    restrictions=("HIDDEN_DIM % VEC == 0",),
)

FORWARD_INPUTS = Inputs(ctx=("B", "H", "D"), w_res=("H", "D"), bias_res=("H",))
BACKWARD_INPUTS = Inputs(ctx=("B", "H", "D"), w_res=("H", "D"), grad_residual=("B", "H"))


class PerHorizonResidual(HorizonOp):
    """residual = proj.forward(ctx, w_res, bias_res);
    grad_w_res, grad_bias_res, grad_ctx = proj.backward(ctx, w_res, grad_residual)."""

    FAMILY = "residual"
    SPACES = by_role(FORWARD_SPACE, BACKWARD_SPACE)

    def forward(self, ctx: Any, w_res: Any, bias_res: Any, *, stream: Any = None) -> Any:
        """residual[B, H] as a GPUArray."""
        (ctx, w_res, bias_res), dims = FORWARD_INPUTS.adapt(self._checked, self.bound, ctx,
                                                             w_res, bias_res)
        b = dims["B"]
        plan = self.plan("forward", {"B": b}, lambda p: (
            (-(-b // p["ROWS"]), 1, 1), (p["BLOCK"], 1, 1), 0))
        check_aligned(plan.params["VEC"], ctx=ctx, w_res=w_res)
        out = empty((b, self.n_horizons))
        plan.kernel(plan.grid, plan.block, ctx=ctx.gpudata, w_res=w_res.gpudata,
                    bias_res=bias_res.gpudata, residual=out.gpudata, B=b, stream=stream)
        return out

    def backward(self, ctx: Any, w_res: Any, grad_residual: Any, *, out: Any = None,
                 accumulate: bool = False, stream: Any = None) -> tuple[Any, Any, Any]:
        """grad_w_res[H, D], grad_bias_res[H], grad_ctx[B, H, D].

        ``out`` (a GPUArray [B, H, D]) receives grad_ctx in place; with ``accumulate=True`` the
        gradient is added to what ``out`` holds, so the pool backward's grad_ctx input collects
        both consumers' gradients with no extra buffer or pass.
        """
        (ctx, w_res, grad_residual), dims = BACKWARD_INPUTS.adapt(
            self._checked, self.bound, ctx, w_res, grad_residual)
        b, h, d = dims["B"], dims["H"], dims["D"]
        out = output_buffer(out, accumulate, "grad_ctx", ("B", "H", "D"), dims)
        plan = self.plan("backward", {"B": b}, lambda p: (
            (-(-b // p["ROWS"]), 1, 1), (p["BLOCK"], 1, 1), 0))
        check_aligned(plan.params["VEC"], ctx=ctx, w_res=w_res, out=out)
        blocks = plan.grid[0]
        gw, gb = empty((blocks, h * d)), empty((blocks, h))
        plan.kernel(plan.grid, plan.block, ctx=ctx.gpudata, w_res=w_res.gpudata,
                    grad_residual=grad_residual.gpudata, gw_scratch=gw.gpudata,
                    gb_scratch=gb.gpudata, grad_ctx=out.gpudata, B=b,
                    accumulate=1 if accumulate else 0, stream=stream)
        red = reducer()
        return (red.sum_rows(gw, blocks, h * d, stream, (h, d)),
                red.sum_rows(gb, blocks, h, stream), out)


def torch_forward(torch: Any, ctx: Any, w_res: Any, bias_res: Any) -> Any:
    return torch.einsum("bhd,hd->bh", ctx, w_res) + bias_res


def torch_backward(torch: Any, ctx: Any, w_res: Any, grad_residual: Any) -> tuple[Any, ...]:
    return (torch.einsum("bh,bhd->hd", grad_residual, ctx), grad_residual.sum(dim=0),
            grad_residual.unsqueeze(-1) * w_res)


def parity(make_op: Callable[[Mapping[str, int]], Any], template: Mapping[str, int]) -> dict:
    """The original project's parity test: B=3, loss = sum(residual), central differences at 8
    w_res, every bias_res and 8 ctx entries against the backward kernel."""
    h, d = template["N_HORIZONS"], template["HIDDEN_DIM"]
    rng = np.random.default_rng(2025)
    x = {"ctx": rng.standard_normal((3, h, d), dtype=np.float32),
         "w_res": rng.standard_normal((h, d), dtype=np.float32),
         "bias_res": rng.standard_normal(h, dtype=np.float32)}
    proj = make_op(template)

    def loss() -> float:
        out = proj.forward(x["ctx"], x["w_res"], x["bias_res"]).get()
        return float(out.astype(np.float64).sum())

    gw, gb, gctx = proj.backward(x["ctx"], x["w_res"], np.ones((3, h), np.float32))
    analytic = {"w_res": gw.get(), "bias_res": gb.get(), "ctx": gctx.get()}
    probes = {"w_res": ref.random_indices(rng, (h, d), 8), "bias_res": [(i,) for i in range(h)],
              "ctx": ref.random_indices(rng, (3, h, d), 8)}
    return {"parity_numgrad": ref.central_differences(loss, x, analytic, probes)}


TENSORS = {"ctx": Tensor(("B", "H", "D")), "w_res": Tensor(("H", "D")),
           "bias_res": Tensor(("H",)), "grad_residual": Tensor(("B", "H")),
           "residual": Tensor(("B", "H")), "grad_w_res": Tensor(("H", "D")),
           "grad_bias_res": Tensor(("H",)), "grad_ctx": Tensor(("B", "H", "D"))}
SUITE = ({"B": 3}, {"B": 4096}, {"B": 65536})
GRID = (({}, {"B": 1}), ({}, {"B": 7}), ({}, {"B": 1000}), ({"N_HORIZONS": 1}, {"B": 5}),
        ({"HIDDEN_DIM": 64}, {"B": 9}), ({"HIDDEN_DIM": 256}, {"B": 9}))
_COMMON_SPEC = dict(op=PerHorizonResidual, template_keys=("N_HORIZONS", "HIDDEN_DIM"),
                    tensors=TENSORS, suite=SUITE, grid=GRID, oracles=parity)

SPECS = (
    KernelSpec(method="forward", space=FORWARD_SPACE,
               reads=("ctx", "w_res", "bias_res"), writes=("residual",),
               reference=ref.residual_forward, peer=torch_forward, **_COMMON_SPEC),
    KernelSpec(method="backward", space=BACKWARD_SPACE,
               reads=("ctx", "w_res", "grad_residual"),
               writes=("grad_w_res", "grad_bias_res", "grad_ctx"),
               reference=ref.residual_backward, peer=torch_backward, **_COMMON_SPEC),
)
