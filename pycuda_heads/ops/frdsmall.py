"""The FRD head for small batches (cu/frdsmall.cu): the same three stages as ``FrdHead``
(forward, grad_w2 = F.3b, grad_w1 = F.3c), with the same arguments and results, for batches too
small to fill the GPU with ``FrdHead``'s row chunks. The work is spread over output elements in
FP32 FMAs; the weight gradients come out of the kernel whole (no scratch, no reduce), so each
stage is one launch. It shares ``FrdHead``'s methods, inputs, tensors and oracles: the same head.
Its ``forward_loss`` keeps a block's rows' logits in shared memory for the loss, as FrdHead's."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Mapping

from ..core.arrays import empty
from ..core.space import KernelSpace, by_role
from . import frdhead
from .frdhead import GRAD_W1_INPUTS, GRAD_W2_INPUTS, FrdHead, _split


def forward_shared_bytes(p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    """ROWS rows of h_t and of hidden."""
    return 4 * p["ROWS"] * (env["D_IN"] + env["FRD_HIDDEN"])


def forward_loss_shared_bytes(p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    """The forward's rows and their logits."""
    return forward_shared_bytes(p, env) + 4 * p["ROWS"] * env["N_HORIZONS"] * env["N_ATOMS"]


def grad_w2_shared_bytes(p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    """The weight part's partial sums, or ROWS rows of grad_logits."""
    return 4 * max(32 * p["WARPS"], p["ROWS"] * env["N_HORIZONS"] * env["N_ATOMS"])


def grad_w1_shared_bytes(p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    """The weight part's partial sums, or ROWS rows of dpre."""
    return 4 * max(32 * p["WARPS"], p["ROWS"] * env["FRD_HIDDEN"])


def weight_blocks(p: Mapping[str, Any], m: int, n: int) -> int:
    """Blocks of a backward stage's weight part: m*n weights and m biases, 32 per group of
    SPLIT warps (WEIGHT_BLOCKS in the kernel)."""
    return -(-(m * n + m) // (32 * (p["WARPS"] // p["SPLIT"])))


# WARPS per block, ROWS per block, SPLIT warps sharing one weight's batch sum. A lane keeps
# ceil(K / 32) weights of a row in registers in the forward: D_in and F up to 1024.
_KNOBS = {"WARPS": (4, 8, 16, 32), "ROWS": (1, 2, 4, 8, 16), "SPLIT": (1, 2, 4, 8, 16, 32)}
_RULES = ("WARPS % SPLIT == 0", "D_IN <= 1024", "FRD_HIDDEN <= 1024")
_LAUNCH = ("SHARED_BYTES <= MAX_SHARED_BYTES",)

FORWARD_SPACE = KernelSpace(
    kernel="frdsmall.forward", params=_KNOBS, default={"WARPS": 32, "ROWS": 2, "SPLIT": 1},
    restrictions=_RULES, launch_restrictions=_LAUNCH, shared_bytes=forward_shared_bytes)
FORWARD_LOSS_SPACE = KernelSpace(
    kernel="frdsmall.forward_loss", params=_KNOBS, default={"WARPS": 32, "ROWS": 2, "SPLIT": 1},
    restrictions=_RULES, launch_restrictions=_LAUNCH, shared_bytes=forward_loss_shared_bytes)
GRAD_W2_SPACE = KernelSpace(
    kernel="frdsmall.grad_w2", params=_KNOBS, default={"WARPS": 8, "ROWS": 2, "SPLIT": 4},
    restrictions=_RULES, launch_restrictions=_LAUNCH, shared_bytes=grad_w2_shared_bytes)
GRAD_W1_SPACE = KernelSpace(
    kernel="frdsmall.grad_w1", params=_KNOBS, default={"WARPS": 8, "ROWS": 2, "SPLIT": 4},
    restrictions=_RULES, launch_restrictions=_LAUNCH, shared_bytes=grad_w1_shared_bytes)


class FrdHeadSmall(FrdHead):
    """``FrdHead``'s stages for small batches, called the same way:
    hidden, logits = head.forward(h_t, w1, b1, w2, b2);
    grad_w2, grad_b2, dhidden = head.grad_w2(hidden, w2, grad_logits);
    grad_w1, grad_b1, grad_h_t = head.grad_w1(h_t, w1, hidden, dhidden);
    grad_w1, grad_b1, grad_w2, grad_b2, grad_h_t = head.backward(h_t, w1, w2, hidden,
                                                                 grad_logits).
    D_in and F (``hidden``) up to 1024."""

    FAMILY = "frdsmall"
    SPACES = by_role(FORWARD_SPACE, FORWARD_LOSS_SPACE, GRAD_W2_SPACE, GRAD_W1_SPACE)
    PDL = True

    def __init__(self, d_in: int, hidden: int, n_horizons: int, n_atoms: int = 21,
                 launch: Mapping[str, Mapping[str, Any]] | None = None):
        for name, n in (("d_in", d_in), ("hidden", hidden)):
            if isinstance(n, int) and n > 1024:  # a lane holds ceil(n / 32) weights of a row
                raise ValueError(f"FrdHeadSmall: {name} must be at most 1024, got {n} "
                                 "(FrdHead takes any size)")
        super().__init__(d_in, hidden, n_horizons, n_atoms, launch)

    def _forward_geometry(self, role: str, b: int) -> Callable[[Mapping[str, Any]], tuple]:
        shared = self.SPACES[role].shared_bytes
        return lambda p: ((-(-b // p["ROWS"]), 1, 1), (32 * p["WARPS"], 1, 1),
                          shared(p, self.template))

    def grad_w2(self, hidden: Any, w2: Any, grad_logits: Any, *,
                stream: Any = None) -> tuple[Any, Any, Any]:
        """F.3b: grad_w2[H, A, F], grad_b2[H, A] and dhidden[B, F]."""
        (hidden, w2, grad_logits), dims = GRAD_W2_INPUTS.adapt(self._checked, self.bound,
                                                               hidden, w2, grad_logits)
        b, ha, f = dims["B"], self.n_horizons * self.n_atoms, self.hidden
        plan = self._stage("grad_w2", b, ha, f, grad_w2_shared_bytes)
        grads, dhidden = empty((ha * f + ha,)), empty((b, f))
        plan.kernel(plan.grid, plan.block, hidden=hidden.gpudata, w2=w2.gpudata,
                    grad_logits=grad_logits.gpudata, grads=grads.gpudata,
                    dhidden=dhidden.gpudata, B=b, shared=plan.shared, stream=stream)
        return (*_split(grads, (self.n_horizons, self.n_atoms, f),
                        (self.n_horizons, self.n_atoms)), dhidden)

    def grad_w1(self, h_t: Any, w1: Any, hidden: Any, dhidden: Any, *,
                stream: Any = None) -> tuple[Any, Any, Any]:
        """F.3c: grad_w1[F, D_in], grad_b1[F] and grad_h_t[B, D_in]; units with hidden == 0
        (pre-activation <= 0) pass no gradient."""
        (h_t, w1, hidden, dhidden), dims = GRAD_W1_INPUTS.adapt(self._checked, self.bound,
                                                                h_t, w1, hidden, dhidden)
        b, f, d = dims["B"], self.hidden, self.d_in
        plan = self._stage("grad_w1", b, f, d, grad_w1_shared_bytes)
        grads, grad_h_t = empty((f * d + f,)), empty((b, d))
        plan.kernel(plan.grid, plan.block, h_t=h_t.gpudata, w1=w1.gpudata,
                    hidden=hidden.gpudata, dhidden=dhidden.gpudata, grads=grads.gpudata,
                    grad_h_t=grad_h_t.gpudata, B=b, shared=plan.shared, stream=stream)
        return (*_split(grads, (f, d), (f,)), grad_h_t)

    def backward(self, h_t: Any, w1: Any, w2: Any, hidden: Any, grad_logits: Any, *,
                 stream: Any = None) -> tuple[Any, Any, Any, Any, Any]:
        """Both stages in turn, each at its own point: grad_w1, grad_b1, grad_w2, grad_b2,
        grad_h_t."""
        gw2, gb2, dhidden = self.grad_w2(hidden, w2, grad_logits, stream=stream)
        gw1, gb1, gh = self.grad_w1(h_t, w1, hidden, dhidden, stream=stream)
        return gw1, gb1, gw2, gb2, gh

    def _stage(self, role: str, b: int, m: int, n: int, shared_bytes: Any) -> Any:
        """A backward stage's launch: its weight part's blocks, then ceil(B / ROWS) row blocks."""
        return self.plan(role, {"B": b}, lambda p: (
            (weight_blocks(p, m, n) + math.ceil(b / p["ROWS"]), 1, 1), (32 * p["WARPS"], 1, 1),
            shared_bytes(p, self.template)))


SUITE = ({"B": 2}, {"B": 256}, {"B": 1024})
#: FrdHead's kernels (tensors, references, peers, oracles, products) run by this op, but its
#: ``backward``, here the stages in turn; the fused forward and loss of the training step has
#: odd shapes of its own
SPECS = tuple(
    replace(spec, op=FrdHeadSmall, space=FrdHeadSmall.SPACES[spec.method], suite=SUITE)
    if not spec.fuses else
    replace(spec, op=FrdHeadSmall, space=FORWARD_LOSS_SPACE, suite=SUITE,
            fuses=("frdsmall.forward", "frd.softmax_ce_grad"),
            # one row, two blocks, atoms over a warp, H=1, odd D_in and F
            grid=(({}, {"B": 1}), ({}, {"B": 3}), ({}, {"B": 333}), ({"N_ATOMS": 51}, {"B": 5}),
                  ({"N_HORIZONS": 1, "N_ATOMS": 11}, {"B": 4}),
                  ({"D_IN": 37, "FRD_HIDDEN": 50}, {"B": 97})))
    for spec in frdhead.SPECS if spec.method != "backward")
