"""The FRD head for small batches (cu/frdsmall.cu): the same three stages as ``FrdHead``
(forward, grad_w2 = F.3b, grad_w1 = F.3c), with the same arguments and results, for batches too
small to fill the GPU with ``FrdHead``'s row chunks. The work is spread over output elements in
FP32 FMAs; the weight gradients come out of the kernel whole (no scratch, no reduce), so each
stage is one launch. It shares ``FrdHead``'s inputs, tensors and oracles: the same head.

``forward_loss`` is the forward fused with the FRD loss (``FrdSoftmaxCE.softmax_ce_grad``, the
same math) on logits that never leave the block: one launch where there were two."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Mapping

import numpy as np

from .. import reference as ref
from ..core.arrays import Inputs, empty
from ..core.space import KernelSpace, by_role
from ..core.spec import KernelSpec, Tensor, draw_labels
from . import frdhead
from .frdhead import FORWARD_INPUTS, GRAD_W1_INPUTS, GRAD_W2_INPUTS, FrdHead, _split


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
    grad_w1, grad_b1, grad_h_t = head.grad_w1(h_t, w1, hidden, dhidden).
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

    def forward(self, h_t: Any, w1: Any, b1: Any, w2: Any, b2: Any, *,
                stream: Any = None) -> tuple[Any, Any]:
        """hidden[B, F] (kept for the backward) and logits[B, H, A] as GPUArrays."""
        (h_t, w1, b1, w2, b2), dims = FORWARD_INPUTS.adapt(self._checked, self.bound,
                                                            h_t, w1, b1, w2, b2)
        b = dims["B"]
        plan = self.plan("forward", {"B": b}, lambda p: (
            (-(-b // p["ROWS"]), 1, 1), (32 * p["WARPS"], 1, 1),
            forward_shared_bytes(p, self.template)))
        hidden, logits = empty((b, self.hidden)), empty((b, self.n_horizons, self.n_atoms))
        plan.kernel(plan.grid, plan.block, h_t=h_t.gpudata, w1=w1.gpudata, b1=b1.gpudata,
                    w2=w2.gpudata, b2=b2.gpudata, hidden=hidden.gpudata, logits=logits.gpudata,
                    B=b, shared=plan.shared, stream=stream)
        return hidden, logits

    def forward_loss(self, h_t: Any, w1: Any, b1: Any, w2: Any, b2: Any, labels: Any, *,
                     stream: Any = None) -> tuple[Any, Any, Any, Any]:
        """The forward and the FRD loss in one launch: hidden[B, F], logits[B, H, A], and
        ``FrdSoftmaxCE.softmax_ce_grad``'s grad_logits[B, H, A] = (softmax - onehot) / B and
        ce[B, H] (label -1: zero row and loss). Labels are not checked here: a label outside
        [-1, A) makes its row NaN."""
        (h_t, w1, b1, w2, b2, labels), dims = LOSS_INPUTS.adapt(
            self._checked, self.bound, h_t, w1, b1, w2, b2, labels)
        b, h, a = dims["B"], self.n_horizons, self.n_atoms
        plan = self.plan("forward_loss", {"B": b}, lambda p: (
            (-(-b // p["ROWS"]), 1, 1), (32 * p["WARPS"], 1, 1),
            forward_loss_shared_bytes(p, self.template)))
        hidden, logits, grad_logits = empty((b, self.hidden)), empty((b, h, a)), empty((b, h, a))
        ce = empty((b, h))
        plan.kernel(plan.grid, plan.block, h_t=h_t.gpudata, w1=w1.gpudata, b1=b1.gpudata,
                    w2=w2.gpudata, b2=b2.gpudata, labels=labels.gpudata, hidden=hidden.gpudata,
                    logits=logits.gpudata, grad_logits=grad_logits.gpudata, ce=ce.gpudata, B=b,
                    inv_b=1.0 / b, shared=plan.shared, stream=stream)
        return hidden, logits, grad_logits, ce

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

    def _stage(self, role: str, b: int, m: int, n: int, shared_bytes: Any) -> Any:
        """A backward stage's launch: its weight part's blocks, then ceil(B / ROWS) row blocks."""
        return self.plan(role, {"B": b}, lambda p: (
            (weight_blocks(p, m, n) + math.ceil(b / p["ROWS"]), 1, 1), (32 * p["WARPS"], 1, 1),
            shared_bytes(p, self.template)))


LOSS_INPUTS = Inputs(h_t=("B", "I"), w1=("F", "I"), b1=("F",), w2=("H", "A", "F"), b2=("H", "A"),
                     labels=(("B", "H"), np.int32))
_LOSS_TENSORS = {**frdhead.TENSORS,
                 "labels": Tensor(("B", "H"), dtype="int32", draw=draw_labels),
                 "ce": Tensor(("B", "H"))}
LOSS_NAMES = tuple(name for name, *_ in LOSS_INPUTS.args)


def spec_tensor(name: str, rng: np.random.Generator, template: Mapping[str, int],
                b: int) -> np.ndarray:
    """One input of forward_loss at batch ``b``, drawn as its declaration draws it."""
    t = _LOSS_TENSORS[name]
    dims = {"B": b, "I": template["D_IN"], "F": template["FRD_HIDDEN"],
            "H": template["N_HORIZONS"], "A": template["N_ATOMS"]}
    return np.ascontiguousarray(t.draw(rng, t.shape(dims), dims), dtype=t.dtype)


def forward_loss_reference(h_t: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray,
                           b2: np.ndarray, labels: np.ndarray, dtype: type = np.float64) -> tuple:
    """hidden, logits, grad_logits and ce in ``dtype``: the FRD head's forward, then the
    softmax-CE, each from its own reference."""
    hidden, logits = ref.frdhead_forward(h_t, w1, b1, w2, b2, dtype=dtype)
    return (hidden, logits, *ref.frd_softmax_ce_grad(logits, labels, dtype=dtype))


def torch_forward_loss(torch: Any, h_t: Any, w1: Any, b1: Any, w2: Any, b2: Any,
                       labels: Any) -> tuple[Any, ...]:
    """The same math in torch ops (gather, not the 3-d cross-entropy, whose path takes
    atomics)."""
    hidden, logits = frdhead.torch_forward(torch, h_t, w1, b1, w2, b2)
    live, safe = labels >= 0, labels.long().clamp_min(0)
    p = torch.softmax(logits, dim=-1)
    onehot = torch.nn.functional.one_hot(safe, logits.shape[-1]).to(p.dtype)
    grad = torch.where(live.unsqueeze(-1), (p - onehot) / h_t.shape[0], 0.0)
    p_label = p.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    ce = torch.where(live, -torch.log(p_label.clamp_min(ref.CE_FLOOR)), 0.0)
    return hidden, logits, grad, ce


def forward_loss_oracles(make_op: Callable[[Mapping[str, int]], Any],
                         template: Mapping[str, int]) -> dict:
    """Central differences of the loss sum(ce) / B (float64 over the kernel's ce) against the
    gradient it sends back, at B=3 (two blocks at the default ROWS) and B=300, labels -1 among
    them: in the 8 entries of b2 of largest gradient against grad_logits summed over the batch
    (b2 shifts every row's logits). ``sentinel_rows``: rows labelled -1 have zero grad_logits
    and ce, and their h_t moves no loss."""
    h, a = template["N_HORIZONS"], template["N_ATOMS"]
    rng = np.random.default_rng(2036)
    op, worst, sentinel_ok = make_op(template), 0.0, True
    for b in (3, 300):
        x = {n: spec_tensor(n, rng, template, b) for n in LOSS_NAMES}
        x["labels"][-1] = -1  # a row with no realised horizon

        def loss(x: dict = x, **over: np.ndarray) -> float:
            args = {**x, **over}
            ce = op.forward_loss(*(args[n] for n in LOSS_NAMES))[3].get()
            return float(ce.astype(np.float64).sum() / b)

        _, _, grad_logits, ce = (v.get() for v in op.forward_loss(*(x[n] for n in LOSS_NAMES)))
        sentinel_ok &= bool((grad_logits[-1] == 0).all() and (ce[-1] == 0).all())
        moved = x["h_t"].copy()
        moved[-1] += np.float32(1)
        sentinel_ok &= loss(h_t=moved) == loss()
        grad_b2 = grad_logits.astype(np.float64).sum(axis=0)
        for i in np.argsort(-np.abs(grad_b2), axis=None)[:8]:
            at, want = np.unravel_index(i, (h, a)), float(grad_b2.flat[i])
            plus, minus = x["b2"].copy(), x["b2"].copy()
            plus[at] += np.float32(2e-2)
            minus[at] -= np.float32(2e-2)
            num = (loss(b2=plus) - loss(b2=minus)) / (float(plus[at]) - float(minus[at]))
            worst = max(worst, abs(num - want) / abs(want))
    return {"loss_numgrad": {"passed": worst <= 2e-2, "max_rel_err": worst},
            "sentinel_rows": {"passed": sentinel_ok}}


SUITE = ({"B": 2}, {"B": 256}, {"B": 1024})
#: FrdHead's kernels (tensors, references, peers, oracles, odd-shape grid) run by this op, and
#: the fused forward and loss of the training step
SPECS = (*(replace(spec, op=FrdHeadSmall, space=FrdHeadSmall.SPACES[spec.method], suite=SUITE)
           for spec in frdhead.SPECS),
         KernelSpec(op=FrdHeadSmall, method="forward_loss", space=FORWARD_LOSS_SPACE,
                    template_keys=("D_IN", "FRD_HIDDEN", "N_HORIZONS", "N_ATOMS"),
                    tensors=_LOSS_TENSORS, reads=LOSS_NAMES,
                    writes=("hidden", "logits", "grad_logits", "ce"),
                    reference=forward_loss_reference, peer=torch_forward_loss,
                    oracles=forward_loss_oracles, suite=SUITE,
                    # odd shapes: one row, two blocks, atoms over a warp, H=1, odd D_in and F
                    grid=(({}, {"B": 1}), ({}, {"B": 3}), ({}, {"B": 333}),
                          ({"N_ATOMS": 51}, {"B": 5}), ({"N_HORIZONS": 1, "N_ATOMS": 11},
                                                       {"B": 4}),
                          ({"D_IN": 37, "FRD_HIDDEN": 50}, {"B": 97}))))
