"""The FRD head (cu/frdhead.cu): hidden = ReLU(h_t w1^T + b1), logits = hidden w2^T + b2 over
N_HORIZONS x N_ATOMS return atoms, and its two backward stages around the softmax-CE gradient
of ``FrdSoftmaxCE``: grad_w2 (F.3b: dW2, db2, dhidden) and grad_w1 (F.3c: dW1, db1, dh_t through
the ReLU mask). Weight gradients are per-block scratch rows summed by one reduce_axis0.

``forward_loss`` is the forward fused with the FRD loss (``FrdSoftmaxCE.softmax_ce_grad``, the
same math) on the logits tile a block keeps in shared memory: one launch where there were two,
and the logits are not read back from global memory.

At the model's head shape (D_in = F = 128, 104 < H*A <= 112) on sm_90 every role has a second
engine, knob ``WGMMA`` = 1: Hopper's warpgroup MMA in 3xTF32, two launches a role since both
weights' split halves do not fit one block's shared memory. The forward (cu/frdhead_wgmma.cuh):
hidden, then the logits with or without the loss; each backward stage
(cu/frdhead_wgmma_bwd.cuh): its row product (dhidden or grad_h_t), then its weight gradient's
scratch rows. The forward roles have a third, ``WGMMA`` = 2 (cu/frdhead_f16.cuh): the same
products on FP16 pieces scaled by powers of two (as accurate, at twice the tensor rate), whose
weights fit one block, so both layers and the loss are one launch.

``backward`` is both stages in one call, a role of its own: at ``WGMMA`` = 0 or 1 the stages'
kernels in turn at its point; at ``WGMMA`` = 2 (cu/frdhead_f16_bwd.cuh) both row products (dpre
and grad_h_t) in one launch on FP16 pieces, dhidden never going to memory, then the two WGMMA
weight gradients."""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np

from .. import reference as ref
from ..core import device
from ..core.arrays import Inputs, empty, wrap
from ..core.op import Op
from ..core.sizes import HeaderSizes
from ..core.source import cu_dir
from ..core.space import KernelSpace, by_role
from ..core.spec import KernelSpec, Tensor, draw_labels
from .frd import torch_softmax_ce_grad
from .reduce import reducer

THREADS = 256


_F32 = np.dtype(np.float32)


def _up(n: int, m: int) -> int:
    return -(-n // m) * m


def _row_ext(n: int, bm: int) -> int:
    """Columns a tile of BM rows covers: BM/16 warps down the rows, 128/BM across (ROW_EXT)."""
    return _up(n, 1024 // bm)


def _ld_kmajor(n: int) -> int:
    return _up(n, 32) + 4


def _ld_rows(n: int) -> int:
    return _up(n, 32) + 8


# The WGMMA engines' tile rows and shared-memory floats, as cu/frdhead_wgmma.cuh and
# cu/frdhead_f16.cuh declare them.
SIZES = HeaderSizes(cu_dir() / "frdhead.cu", cu_dir() / "frdhead_wgmma.cuh",
                    cu_dir() / "frdhead_f16.cuh")
WG_ROWS, WG_N2 = SIZES.value("WG_ROWS", {}), SIZES.value("WG_N2", {})
BWD_SIZES = HeaderSizes(cu_dir() / "frdhead.cu", cu_dir() / "frdhead_wgmma_bwd.cuh",
                        cu_dir() / "frdhead_f16_bwd.cuh")


def wg_hidden_shared_bytes(p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    return 4 * SIZES.value("WG_HIDDEN_FLOATS", {**env, **p})


def wg_logits_shared_bytes(p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    """The layer-2 block: w2's halves, the row buffers and each warp's 8 staged logits rows."""
    return 4 * SIZES.value("WG_LOGITS_FLOATS", {**env, **p})


def wf_shared_bytes(p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    """The FP16 engine's one launch: both weights' pieces, the row buffers, the staged rows."""
    return 4 * SIZES.value("WF_FLOATS", {**env, **p})


def wb_row_shared_bytes(role: str, p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    """A WGMMA backward stage's row-product launch (dhidden or grad_h_t)."""
    name = "WB_DHIDDEN_FLOATS" if role == "grad_w2" else "WB_GRAD_H_T_FLOATS"
    return 4 * BWD_SIZES.value(name, {**env, **p})


def wb_grad_shared_bytes(role: str, p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    """A WGMMA backward stage's weight-gradient launch."""
    return 4 * BWD_SIZES.value(f"WB_{role.upper()}_FLOATS", {**env, **p})


def forward_shared_bytes(p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    """w1 and w2 (rows padded to the warps' columns), two h_t tiles and the hidden tile; under
    WGMMA 1 the larger of its two launches', under WGMMA 2 its one launch's."""
    if p.get("WGMMA") == 2:
        return wf_shared_bytes(p, env)
    if p.get("WGMMA"):
        return max(wg_hidden_shared_bytes(p, env), wg_logits_shared_bytes(p, env))
    d, f, ha, bm = env["D_IN"], env["FRD_HIDDEN"], env["N_HORIZONS"] * env["N_ATOMS"], p["BM"]
    return 4 * ((_row_ext(f, bm) + 2 * bm) * _ld_rows(d) + (_row_ext(ha, bm) + bm) * _ld_rows(f))


def forward_loss_shared_bytes(p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    """The forward's, and the logits tile (under WGMMA the loss runs on the staged rows)."""
    extra = 0 if p.get("WGMMA") else 4 * p["BM"] * env["N_HORIZONS"] * env["N_ATOMS"]
    return forward_shared_bytes(p, env) + extra


def _stage_shared_bytes(p: Mapping[str, Any], m: int, n: int, masked: bool) -> int:
    """A backward stage over A[B, m], X[B, n], W[m, n]: W, then two A, two X (and two mask)
    tiles."""
    bm = p["BM"]
    return 4 * (_up(m, 8) * _ld_kmajor(_row_ext(n, bm))
                + 2 * bm * ((2 if masked else 1) * _ld_kmajor(m) + _ld_kmajor(n)))


def wr_rows_shared_bytes(p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    """The FP16 backward's row-product launch: both weights' pieces and a G tile a warpgroup."""
    return 4 * BWD_SIZES.value("WR_ROWS_FLOATS", {**env, **p})


def wr_grad_w1_shared_bytes(p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    """The FP16 backward's grad_w1 weight gradient, over the masked dpre: no mask tiles."""
    return 4 * BWD_SIZES.value("WR_GRAD_W1_FLOATS", {**env, **p})


def _wb_shared_bytes(role: str, p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    return max(wb_row_shared_bytes(role, p, env), wb_grad_shared_bytes(role, p, env))


def grad_w2_shared_bytes(p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    """Under WGMMA the larger of its two launches'."""
    if p.get("WGMMA"):
        return _wb_shared_bytes("grad_w2", p, env)
    return _stage_shared_bytes(p, env["N_HORIZONS"] * env["N_ATOMS"], env["FRD_HIDDEN"], False)


def grad_w1_shared_bytes(p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    """Under WGMMA the larger of its two launches'."""
    if p.get("WGMMA"):
        return _wb_shared_bytes("grad_w1", p, env)
    return _stage_shared_bytes(p, env["FRD_HIDDEN"], env["D_IN"], True)


def backward_shared_bytes(p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    """The largest of its launches'."""
    if p.get("WGMMA") == 2:
        return max(wr_rows_shared_bytes(p, env), wb_grad_shared_bytes("grad_w2", p, env),
                   wr_grad_w1_shared_bytes(p, env))
    return max(grad_w2_shared_bytes(p, env), grad_w1_shared_bytes(p, env))


# BM rows per tile (one m16 tile per warp row), CHUNK rows per block. Accumulators stay at or
# below 64 registers per thread: a row tile's warp holds ceil(n / (1024 / BM)) m16n8 tiles of 4,
# a weight gradient's ceil(m/32) x ceil(n/32). The weights must fit shared memory beside two
# tiles. D_in, F and H*A up to 128 each pass every restriction at BM <= 32.
_KNOBS = {"BM": (16, 32, 64), "CHUNK": (64, 128, 256, 512, 1024, 2048)}
_LAUNCH = ("SHARED_BYTES <= MAX_SHARED_BYTES",)
_CHUNK_RULE = "CHUNK % BM == 0"

_WG_SHAPE_RULE = ("WGMMA == 0 or (D_IN == 128 and FRD_HIDDEN == 128 "
                  f"and {WG_N2 - 8} < N_HORIZONS * N_ATOMS <= {WG_N2})")

# The forward roles' engine: WGMMA 0 the mma.sync tiles above; 1 Hopper's warpgroup MMA for the
# model's head shape, WG warpgroups a block, CS k-steps a chunk, SWZ the row buffer's layout;
# 2 the same on FP16 pieces in one launch (WG and SWZ; a tile's products go out at once, no CS).
# Each engine's knobs sit at their defaults under the others, so every point is a distinct kernel.
_FORWARD_KNOBS = {**_KNOBS, "WGMMA": (0, 1, 2), "WG": (1, 2), "CS": (4, 16), "SWZ": (0, 1)}
_FORWARD_DEFAULT = {"BM": 32, "CHUNK": 256, "WGMMA": 0, "WG": 2, "CS": 16, "SWZ": 1}
_FORWARD_RULES = (_CHUNK_RULE,
                  "(FRD_HIDDEN + 1024 // BM - 1) // (1024 // BM) <= 16",
                  "(N_HORIZONS * N_ATOMS + 1024 // BM - 1) // (1024 // BM) <= 16",
                  "WGMMA != 0 or (WG == 2 and CS == 16 and SWZ == 1)",
                  "WGMMA != 2 or CS == 16",
                  "WGMMA == 0 or (BM == 32 and CHUNK == 256)",
                  _WG_SHAPE_RULE)
FORWARD_SPACE = KernelSpace(
    kernel="frdhead.forward", params=_FORWARD_KNOBS, default=_FORWARD_DEFAULT,
    restrictions=_FORWARD_RULES, launch_restrictions=_LAUNCH, shared_bytes=forward_shared_bytes)
FORWARD_LOSS_SPACE = KernelSpace(
    kernel="frdhead.forward_loss", params=_FORWARD_KNOBS, default=_FORWARD_DEFAULT,
    restrictions=_FORWARD_RULES, launch_restrictions=_LAUNCH,
    shared_bytes=forward_loss_shared_bytes)

# The backward stages' engine: WGMMA 1 runs each stage as a row product (WG warpgroups a block,
# CS k-steps a chunk) and a weight gradient (BK batch rows a step, OCC blocks an SM, a ring of
# STAGES steps' raw tiles) on Hopper's warpgroup MMA, for the model's head shape; knobs pinned
# under the other engine as above.
_GRAD_KNOBS = {**_KNOBS, "WGMMA": (0, 1), "WG": (1, 2), "CS": (2, 4, 8), "BK": (16, 32),
               "OCC": (1, 2), "STAGES": (2, 3, 4)}
_GRAD_DEFAULT = {"BM": 32, "CHUNK": 256, "WGMMA": 0, "WG": 2, "CS": 4, "BK": 32, "OCC": 2,
                 "STAGES": 2}
# BK 64 is not a value: a step's X halves are double-buffered, and at 64 rows they and the
# ring of raw tiles need more shared memory than an SM has.
_GRAD_RULES = (_CHUNK_RULE,
               "WGMMA == 1 or (WG == 2 and CS == 4 and BK == 32 and OCC == 2 and STAGES == 2)",
               "WGMMA == 0 or (BM == 32 and CHUNK == 256)",
               _WG_SHAPE_RULE)


def _occ_rule(floats: str, engines: str = "WGMMA == 0") -> str:
    """OCC weight-gradient blocks of ``floats`` shared floats share a multiprocessor (1 KB
    reserved a block), but under ``engines``."""
    return f"{engines} or OCC * (4 * {BWD_SIZES.expr(floats)} + 1024) <= MAX_SHARED_BYTES + 1024"


def _grad_launch(role: str) -> tuple[str, ...]:
    return (*_LAUNCH, _occ_rule(f"WB_{role.upper()}_FLOATS"))


GRAD_W2_SPACE = KernelSpace(
    kernel="frdhead.grad_w2", params=_GRAD_KNOBS, default=_GRAD_DEFAULT,
    restrictions=(*_GRAD_RULES,
                  "((N_HORIZONS * N_ATOMS + 31) // 32) * ((FRD_HIDDEN + 31) // 32) <= 16"),
    launch_restrictions=_grad_launch("grad_w2"), shared_bytes=grad_w2_shared_bytes)

# grad_w1's weight gradient also stages the mask's tile a step: two blocks an SM fit shared
# memory only at BK 16 (its launch restriction).
GRAD_W1_SPACE = KernelSpace(
    kernel="frdhead.grad_w1", params=_GRAD_KNOBS, default=_GRAD_DEFAULT,
    restrictions=(*_GRAD_RULES, "((FRD_HIDDEN + 31) // 32) * ((D_IN + 31) // 32) <= 16"),
    launch_restrictions=_grad_launch("grad_w1"), shared_bytes=grad_w1_shared_bytes)

# Both stages at one point: WGMMA 0 and 1 the stages' kernels, with their knobs; 2 both row
# products in one launch (WG warpgroups a block; no CS), then WGMMA 1's weight gradients (BK,
# OCC, STAGES), grad_w1's over the masked dpre with no mask tiles. Every rule of both stages
# holds.
BACKWARD_SPACE = KernelSpace(
    kernel="frdhead.backward", params={**_GRAD_KNOBS, "WGMMA": (0, 1, 2)}, default=_GRAD_DEFAULT,
    restrictions=(_CHUNK_RULE,
                  "WGMMA != 0 or (WG == 2 and CS == 4 and BK == 32 and OCC == 2 and STAGES == 2)",
                  "WGMMA != 2 or CS == 4",
                  *_GRAD_RULES[2:], *GRAD_W2_SPACE.restrictions[len(_GRAD_RULES):],
                  *GRAD_W1_SPACE.restrictions[len(_GRAD_RULES):]),
    launch_restrictions=(*_grad_launch("grad_w2"),
                         _occ_rule("WB_GRAD_W1_FLOATS", "WGMMA != 1"),
                         _occ_rule("WR_GRAD_W1_FLOATS", "WGMMA != 2")),
    shared_bytes=backward_shared_bytes)


FORWARD_INPUTS = Inputs(h_t=("B", "I"), w1=("F", "I"), b1=("F",), w2=("H", "A", "F"),
                        b2=("H", "A"))
GRAD_W2_INPUTS = Inputs(hidden=("B", "F"), w2=("H", "A", "F"), grad_logits=("B", "H", "A"))
GRAD_W1_INPUTS = Inputs(h_t=("B", "I"), w1=("F", "I"), hidden=("B", "F"), dhidden=("B", "F"))
BACKWARD_INPUTS = Inputs(h_t=("B", "I"), w1=("F", "I"), w2=("H", "A", "F"), hidden=("B", "F"),
                         grad_logits=("B", "H", "A"))
LOSS_INPUTS = Inputs(h_t=("B", "I"), w1=("F", "I"), b1=("F",), w2=("H", "A", "F"), b2=("H", "A"),
                     labels=(("B", "H"), np.int32))
LOSS_NAMES = tuple(name for name, *_ in LOSS_INPUTS.args)


class FrdHead(Op):
    """hidden, logits = head.forward(h_t, w1, b1, w2, b2);
    grad_w2, grad_b2, dhidden = head.grad_w2(hidden, w2, grad_logits);
    grad_w1, grad_b1, grad_h_t = head.grad_w1(h_t, w1, hidden, dhidden);
    grad_w1, grad_b1, grad_w2, grad_b2, grad_h_t = head.backward(h_t, w1, w2, hidden,
                                                                 grad_logits)   (both stages).

    Shapes: h_t [B, D_in], w1 [F, D_in], b1 [F], w2 [H, A, F] (the [H*A, F] layer-2 matrix
    viewed per horizon), b2 [H, A]; logits [B, H, A] go to ``FrdSoftmaxCE``.
    """

    FAMILY = "frdhead"
    SPACES = by_role(FORWARD_SPACE, FORWARD_LOSS_SPACE, GRAD_W2_SPACE, GRAD_W1_SPACE,
                     BACKWARD_SPACE)

    @classmethod
    def constructor_kwargs(cls, template: Mapping[str, int]) -> dict[str, int]:
        """The template constant FRD_HIDDEN is the constructor's ``hidden``."""
        kwargs = super().constructor_kwargs(template)
        kwargs["hidden"] = kwargs.pop("frd_hidden")
        return kwargs

    def __init__(self, d_in: int, hidden: int, n_horizons: int, n_atoms: int = 21,
                 launch: Mapping[str, Mapping[str, Any]] | None = None):
        super().__init__({"D_IN": d_in, "FRD_HIDDEN": hidden, "N_HORIZONS": n_horizons,
                          "N_ATOMS": n_atoms}, launch)
        self.d_in, self.hidden, self.n_horizons, self.n_atoms = d_in, hidden, n_horizons, n_atoms
        self.bound = {"I": d_in, "F": hidden, "H": n_horizons, "A": n_atoms}
        #: (role, entry, B) -> a launch a plan does not hold (bound kernel, grid, block, shared
        #: bytes): the WGMMA engines' first launches, the backward's
        self._launches: dict[tuple[str, str, int], tuple] = {}

    def forward(self, h_t: Any, w1: Any, b1: Any, w2: Any, b2: Any, *,
                stream: Any = None) -> tuple[Any, Any]:
        """hidden[B, F] (kept for the backward) and logits[B, H, A] as GPUArrays."""
        (h_t, w1, b1, w2, b2), dims = FORWARD_INPUTS.adapt(self._checked, self.bound,
                                                            h_t, w1, b1, w2, b2)
        b = dims["B"]
        plan = self.plan("forward", {"B": b}, self._forward_geometry("forward", b))
        hidden, logits = empty((b, self.hidden)), empty((b, self.n_horizons, self.n_atoms))
        if plan.params.get("WGMMA") == 2:  # one launch, mma.sync's arguments
            self._aligned(h_t=h_t, w1=w1, w2=w2)
        elif plan.params.get("WGMMA"):
            self._wg_hidden("forward", plan, h_t, w1, b1, w2, hidden, b, stream)
            plan.kernel(plan.grid, plan.block, hidden=hidden.gpudata, w2=w2.gpudata,
                        b2=b2.gpudata, logits=logits.gpudata, B=b, shared=plan.shared,
                        stream=stream)
            return hidden, logits
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
        plan = self.plan("forward_loss", {"B": b}, self._forward_geometry("forward_loss", b))
        hidden, logits, grad_logits = empty((b, self.hidden)), empty((b, h, a)), empty((b, h, a))
        ce = empty((b, h))
        if plan.params.get("WGMMA") == 2:  # one launch, mma.sync's arguments
            self._aligned(h_t=h_t, w1=w1, w2=w2)
        elif plan.params.get("WGMMA"):
            self._wg_hidden("forward_loss", plan, h_t, w1, b1, w2, hidden, b, stream)
            plan.kernel(plan.grid, plan.block, hidden=hidden.gpudata, w2=w2.gpudata,
                        b2=b2.gpudata, labels=labels.gpudata, logits=logits.gpudata,
                        grad_logits=grad_logits.gpudata, ce=ce.gpudata, B=b, inv_b=1.0 / b,
                        shared=plan.shared, stream=stream)
            return hidden, logits, grad_logits, ce
        plan.kernel(plan.grid, plan.block, h_t=h_t.gpudata, w1=w1.gpudata, b1=b1.gpudata,
                    w2=w2.gpudata, b2=b2.gpudata, labels=labels.gpudata, hidden=hidden.gpudata,
                    logits=logits.gpudata, grad_logits=grad_logits.gpudata, ce=ce.gpudata, B=b,
                    inv_b=1.0 / b, shared=plan.shared, stream=stream)
        return hidden, logits, grad_logits, ce

    def _forward_geometry(self, role: str, b: int) -> Callable[[Mapping[str, Any]], tuple]:
        """(grid, block, shared bytes) of forward kernel ``role`` at batch b, from its launch
        parameters (the shared bytes as its space declares them); under WGMMA the logits
        launch's (WGMMA 1) or the one launch's (2): a block a multiprocessor at most, its
        warpgroups striding over 64-row tiles."""
        shared = self.SPACES[role].shared_bytes

        def geometry(p: Mapping[str, Any]) -> tuple:
            if p.get("WGMMA"):
                blocks = min(device.sm_count(), -(-b // (WG_ROWS * p["WG"])))
                wg_shared = wf_shared_bytes if p["WGMMA"] == 2 else wg_logits_shared_bytes
                return (blocks, 1, 1), (128 * p["WG"], 1, 1), wg_shared(p, self.template)
            return (-(-b // p["CHUNK"]), 1, 1), (THREADS, 1, 1), shared(p, self.template)
        return geometry

    @classmethod
    def entries(cls, role: str, params: Mapping[str, Any]) -> tuple[str, ...]:
        """mma.sync: ``<family>_<role>``. WGMMA 1: the row launch (hidden for the forward roles,
        the stage's row product for the backward ones), then ``<family>_wg_<role>``. WGMMA 2:
        ``<family>_f16_<role>``. ``backward``: the stages' in turn, but at WGMMA 2 the row
        products' one launch ``<family>_f16_rows``, then the two weight gradients (grad_w1's
        over the masked dpre: ``<family>_wg_grad_w1_dpre``)."""
        engine = params.get("WGMMA", 0)
        if role == "backward":
            if engine == 2:
                return (f"{cls.FAMILY}_f16_rows", f"{cls.FAMILY}_wg_grad_w2",
                        f"{cls.FAMILY}_wg_grad_w1_dpre")
            return (*cls.entries("grad_w2", params), *cls.entries("grad_w1", params))
        if engine == 2:
            return (f"{cls.FAMILY}_f16_{role}",)
        if engine == 1:
            first = {"grad_w2": "dhidden", "grad_w1": "grad_h_t"}.get(role, "hidden")
            return (f"{cls.FAMILY}_wg_{first}", f"{cls.FAMILY}_wg_{role}")
        return (f"{cls.FAMILY}_{role}",)

    def _aligned(self, **arrays: Any) -> None:
        """The WGMMA engine copies these arrays' rows in 16-byte pieces."""
        for name, arr in arrays.items():
            if int(arr.gpudata) % 16:
                raise ValueError(f"{type(self).__name__}: {name}: device pointer "
                                 f"{int(arr.gpudata):#x} is not 16-byte aligned, which the WGMMA "
                                 "engine needs; pass an aligned array or launch with WGMMA=0")

    def _launch(self, role: str, entry: str, b: int, params: Mapping[str, Any],
                geometry: Callable[[], tuple]) -> tuple:
        """Entry ``entry`` of ``role``'s launch at ``params``: its bound kernel and ``geometry()``
        = (grid, block, shared bytes), kept per role, entry and batch as a plan is."""
        hit = self._launches.get((role, entry, b))
        if hit is None:
            hit = self._launches[(role, entry, b)] = (
                self.kernel(role, params, entry).__call__, *geometry())
        return hit

    def _wg_hidden(self, role: str, plan: Any, h_t: Any, w1: Any, b1: Any, w2: Any,
                   hidden: Any, b: int, stream: Any) -> None:
        """hidden = ReLU(h_t w1^T + b1), on the logits launch's grid."""
        self._aligned(h_t=h_t, w1=w1, w2=w2)
        call, grid, block, shared = self._launch(
            role, self.entries(role, plan.params)[0], b, plan.params,
            lambda: (plan.grid, plan.block, wg_hidden_shared_bytes(plan.params, self.template)))
        call(grid, block, h_t=h_t.gpudata, w1=w1.gpudata, b1=b1.gpudata,
             hidden=hidden.gpudata, B=b, shared=shared, stream=stream)

    def grad_w2(self, hidden: Any, w2: Any, grad_logits: Any, *,
                stream: Any = None) -> tuple[Any, Any, Any]:
        """F.3b: grad_w2[H, A, F], grad_b2[H, A] and dhidden[B, F]."""
        (hidden, w2, grad_logits), dims = GRAD_W2_INPUTS.adapt(self._checked, self.bound,
                                                               hidden, w2, grad_logits)
        return self._grad_w2("grad_w2", dims["B"], hidden, w2, grad_logits, stream)

    def _grad_w2(self, role: str, b: int, hidden: Any, w2: Any, grad_logits: Any,
                 stream: Any) -> tuple[Any, Any, Any]:
        ha, f = self.n_horizons * self.n_atoms, self.hidden
        dhidden = empty((b, f))
        weights = self._stage(
            "grad_w2", role, b, ha, f, stream,
            aligned=dict(hidden=hidden, grad_logits=grad_logits),
            rows=dict(grad_logits=grad_logits.gpudata, w2=w2.gpudata, dhidden=dhidden.gpudata),
            sums=dict(grad_logits=grad_logits.gpudata, hidden=hidden.gpudata),
            both=dict(hidden=hidden.gpudata, w2=w2.gpudata, grad_logits=grad_logits.gpudata,
                      dhidden=dhidden.gpudata))
        return (*_split(weights, (self.n_horizons, self.n_atoms, f),
                        (self.n_horizons, self.n_atoms)), dhidden)

    def grad_w1(self, h_t: Any, w1: Any, hidden: Any, dhidden: Any, *,
                stream: Any = None) -> tuple[Any, Any, Any]:
        """F.3c: grad_w1[F, D_in], grad_b1[F] and grad_h_t[B, D_in]; units with hidden == 0
        (pre-activation <= 0) pass no gradient."""
        (h_t, w1, hidden, dhidden), dims = GRAD_W1_INPUTS.adapt(self._checked, self.bound,
                                                                h_t, w1, hidden, dhidden)
        return self._grad_w1("grad_w1", dims["B"], h_t, w1, hidden, dhidden, stream)

    def _grad_w1(self, role: str, b: int, h_t: Any, w1: Any, hidden: Any, dhidden: Any,
                 stream: Any) -> tuple[Any, Any, Any]:
        f, d = self.hidden, self.d_in
        grad_h_t = empty((b, d))
        weights = self._stage(
            "grad_w1", role, b, f, d, stream,
            aligned=dict(h_t=h_t, hidden=hidden, dhidden=dhidden),
            rows=dict(dhidden=dhidden.gpudata, hidden=hidden.gpudata, w1=w1.gpudata,
                      grad_h_t=grad_h_t.gpudata),
            sums=dict(dhidden=dhidden.gpudata, hidden=hidden.gpudata, h_t=h_t.gpudata),
            both=dict(h_t=h_t.gpudata, w1=w1.gpudata, hidden=hidden.gpudata,
                      dhidden=dhidden.gpudata, grad_h_t=grad_h_t.gpudata))
        return (*_split(weights, (f, d), (f,)), grad_h_t)

    def _stage(self, stage: str, role: str, b: int, m: int, n: int, stream: Any,
               aligned: Mapping[str, Any], rows: Mapping[str, Any], sums: Mapping[str, Any],
               both: Mapping[str, Any]) -> Any:
        """Backward stage ``stage`` at ``role``'s point (its own, or the backward's); returns its
        [m*n + m] weight and bias gradients, the column sums of a [blocks, m*n + m] scratch (a
        block's partials) by one reduce_axis0. mma.sync: one launch (arguments ``both``) makes
        the row gradient and the partials, CHUNK rows a block. WGMMA: the row product
        (arguments ``rows``; ``aligned`` arrays read in 16-byte pieces), then the weight
        gradient (``sums``)."""
        p = self.launch_params(role, {"B": b})
        if p.get("WGMMA"):
            self._aligned(**aligned)
            call, grid, block, shared = self._launch(
                role, f"{self.FAMILY}_wg_" + {"grad_w2": "dhidden", "grad_w1": "grad_h_t"}[stage],
                b, p, lambda: self._wg_row_geometry(stage, b, p))
            call(grid, block, **rows, B=b, shared=shared, stream=stream)
            return self._weight_grad(f"{self.FAMILY}_wg_{stage}", role, b, p, m * n + m,
                                     wb_grad_shared_bytes(stage, p, self.template), sums, stream)
        shared_bytes = grad_w2_shared_bytes if stage == "grad_w2" else grad_w1_shared_bytes
        call, grid, block, shared = self._launch(
            role, f"{self.FAMILY}_{stage}", b, p,
            lambda: ((-(-b // p["CHUNK"]), 1, 1), (THREADS, 1, 1), shared_bytes(p, self.template)))
        scratch = empty((grid[0], m * n + m))
        call(grid, block, **both, scratch=scratch.gpudata, B=b, shared=shared, stream=stream)
        return reducer().sum_rows(scratch, grid[0], m * n + m, stream)

    def _weight_grad(self, entry: str, role: str, b: int, p: Mapping[str, Any], width: int,
                     shared_bytes: int, sums: Mapping[str, Any], stream: Any) -> Any:
        """A WGMMA weight gradient (``entry``, arguments ``sums``) over contiguous slices of
        whole BK-row steps, OCC blocks a multiprocessor at most: the column sums of its
        [blocks, width] scratch."""
        blocks, per_block = _wg_batch_split(b, p)
        call, grid, block, shared = self._launch(
            role, entry, b, p, lambda: ((blocks, 1, 1), (256, 1, 1), shared_bytes))
        scratch = empty((blocks, width))
        call(grid, block, **sums, scratch=scratch.gpudata, B=b, rows_per_block=per_block,
             shared=shared, stream=stream)
        return reducer().sum_rows(scratch, blocks, width, stream)

    def _wg_row_geometry(self, stage: str, b: int, p: Mapping[str, Any]) -> tuple:
        """A backward stage's row product: a block a multiprocessor at most, its WG warpgroups
        striding over 64-row tiles."""
        blocks = min(device.sm_count(), -(-b // (WG_ROWS * p["WG"])))
        return (blocks, 1, 1), (128 * p["WG"], 1, 1), wb_row_shared_bytes(stage, p, self.template)

    def backward(self, h_t: Any, w1: Any, w2: Any, hidden: Any, grad_logits: Any, *,
                 stream: Any = None) -> tuple[Any, Any, Any, Any, Any]:
        """Both stages (grad_w2's, then grad_w1's) at the point of role ``backward``: grad_w1,
        grad_b1, grad_w2, grad_b2, grad_h_t. At WGMMA 2 dpre = dhidden . [hidden > 0] and
        grad_h_t come from one launch, and grad_w1's weight gradient sums dpre, unmasked."""
        (h_t, w1, w2, hidden, grad_logits), dims = BACKWARD_INPUTS.adapt(
            self._checked, self.bound, h_t, w1, w2, hidden, grad_logits)
        b = dims["B"]
        p = self.launch_params("backward", {"B": b})
        if p.get("WGMMA") != 2:
            gw2, gb2, dhidden = self._grad_w2("backward", b, hidden, w2, grad_logits, stream)
            gw1, gb1, gh = self._grad_w1("backward", b, h_t, w1, hidden, dhidden, stream)
            return gw1, gb1, gw2, gb2, gh
        self._aligned(h_t=h_t, w1=w1, w2=w2, hidden=hidden, grad_logits=grad_logits)
        h, a, f, d = self.n_horizons, self.n_atoms, self.hidden, self.d_in
        dpre, grad_h_t = empty((b, f)), empty((b, d))
        rows, w2_grad, w1_grad = self.entries("backward", p)
        call, grid, block, shared = self._launch(
            "backward", rows, b, p,
            lambda: (self._wg_row_geometry("grad_w2", b, p)[:2]
                     + (wr_rows_shared_bytes(p, self.template),)))
        call(grid, block, grad_logits=grad_logits.gpudata, hidden=hidden.gpudata,
             w1=w1.gpudata, w2=w2.gpudata, dpre=dpre.gpudata, grad_h_t=grad_h_t.gpudata, B=b,
             shared=shared, stream=stream)
        w2_sums = self._weight_grad(w2_grad, "backward", b, p, h * a * f + h * a,
                                    wb_grad_shared_bytes("grad_w2", p, self.template),
                                    dict(grad_logits=grad_logits.gpudata,
                                         hidden=hidden.gpudata), stream)
        w1_sums = self._weight_grad(w1_grad, "backward", b, p, f * d + f,
                                    wr_grad_w1_shared_bytes(p, self.template),
                                    dict(dpre=dpre.gpudata, h_t=h_t.gpudata), stream)
        return (*_split(w1_sums, (f, d), (f,)), *_split(w2_sums, (h, a, f), (h, a)), grad_h_t)


def _wg_batch_split(b: int, p: Mapping[str, Any]) -> tuple[int, int]:
    """(blocks, batch rows a block) of a WGMMA weight gradient: whole BK-row steps, spread
    over OCC blocks a multiprocessor at most."""
    steps = -(-b // p["BK"])
    per_block = -(-steps // min(p["OCC"] * device.sm_count(), steps))
    return -(-steps // per_block), per_block * p["BK"]


def _split(sums: Any, weight_shape: tuple[int, ...], bias_shape: tuple[int, ...]
           ) -> tuple[Any, Any]:
    """The weight and bias gradients of one reduced row [weights | biases], as views."""
    at, n = int(sums.gpudata), math.prod(weight_shape)
    return (wrap(weight_shape, _F32, at, sums), wrap(bias_shape, _F32, at + 4 * n, sums))


def draw_hidden(rng: np.random.Generator, shape: tuple, dims: Mapping[str, int]) -> np.ndarray:
    """ReLU of normal draws: about half the units inactive, as after the forward."""
    return np.maximum(rng.standard_normal(shape, dtype=np.float32), 0)


def draw_grad_logits(rng: np.random.Generator, shape: tuple,
                     dims: Mapping[str, int]) -> np.ndarray:
    """Normal draws / B, with the middle row zero from B = 3 on: a row whose labels are all -1."""
    g = rng.standard_normal(shape, dtype=np.float32) / np.float32(shape[0])
    if shape[0] >= 3:
        g[shape[0] // 2] = 0
    return g


def draw_weights(rng: np.random.Generator, shape: tuple, dims: Mapping[str, int]) -> np.ndarray:
    """N(0, 1/fan_in): pre-activations of order one."""
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)


def torch_forward(torch: Any, h_t: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> tuple[Any, Any]:
    hidden = torch.relu(h_t @ w1.T + b1)
    h, a, f = w2.shape
    return hidden, (hidden @ w2.reshape(h * a, f).T + b2.reshape(-1)).reshape(-1, h, a)


def torch_grad_w2(torch: Any, hidden: Any, w2: Any, grad_logits: Any) -> tuple[Any, Any, Any]:
    h, a, f = w2.shape
    g = grad_logits.reshape(-1, h * a)
    return (g.T @ hidden).reshape(h, a, f), grad_logits.sum(dim=0), g @ w2.reshape(h * a, f)


def torch_grad_w1(torch: Any, h_t: Any, w1: Any, hidden: Any,
                  dhidden: Any) -> tuple[Any, Any, Any]:
    dpre = torch.where(hidden > 0, dhidden, 0.0)
    return dpre.T @ h_t, dpre.sum(dim=0), dpre @ w1


def backward_reference(h_t: np.ndarray, w1: np.ndarray, w2: np.ndarray, hidden: np.ndarray,
                       grad_logits: np.ndarray, dtype: type = np.float64) -> tuple:
    """grad_w1, grad_b1, grad_w2, grad_b2, grad_h_t in ``dtype``: the two stages' references."""
    gw2, gb2, dhidden = ref.frdhead_grad_w2(hidden, w2, grad_logits, dtype=dtype)
    gw1, gb1, gh = ref.frdhead_grad_w1(h_t, w1, hidden, dhidden, dtype=dtype)
    return gw1, gb1, gw2, gb2, gh


def torch_backward(torch: Any, h_t: Any, w1: Any, w2: Any, hidden: Any,
                   grad_logits: Any) -> tuple[Any, ...]:
    """The two stages' peers."""
    gw2, gb2, dhidden = torch_grad_w2(torch, hidden, w2, grad_logits)
    gw1, gb1, gh = torch_grad_w1(torch, h_t, w1, hidden, dhidden)
    return gw1, gb1, gw2, gb2, gh


def _parameters(rng: np.random.Generator, template: Mapping[str, int], b: int) -> dict:
    d, f = template["D_IN"], template["FRD_HIDDEN"]
    h, a = template["N_HORIZONS"], template["N_ATOMS"]
    shapes = {"h_t": (b, d), "w1": (f, d), "b1": (f,), "w2": (h, a, f), "b2": (h, a)}
    return {n: draw_weights(rng, s, {}) if n.startswith("w")
            else rng.standard_normal(s, dtype=np.float32) for n, s in shapes.items()}


def _loss_grad(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """grad_logits of sum(ce) / B in float32, from the reference: the head's oracles test the
    head's kernels alone."""
    return ref.frd_softmax_ce_grad(logits, labels, dtype=np.float32)[0].astype(np.float32)


def _train_step(head: FrdHead, x: Mapping[str, np.ndarray], labels: np.ndarray,
                fused: bool) -> dict[str, np.ndarray]:
    """One forward + softmax-CE + backward (``backward`` when ``fused``, else the stages in
    turn, each at its own point): host gradients by name."""
    hidden, logits = head.forward(x["h_t"], x["w1"], x["b1"], x["w2"], x["b2"])
    grad_logits = _loss_grad(logits.get(), labels)
    if fused:
        gw1, gb1, gw2, gb2, gh = head.backward(x["h_t"], x["w1"], x["w2"], hidden, grad_logits)
    else:
        gw2, gb2, dhidden = head.grad_w2(hidden, x["w2"], grad_logits)
        gw1, gb1, gh = head.grad_w1(x["h_t"], x["w1"], hidden, dhidden)
    grads = {"w1": gw1, "b1": gb1, "w2": gw2, "b2": gb2, "h_t": gh}
    return {n: g.get() for n, g in grads.items()}


def parity(make_op: Callable[[Mapping[str, int]], Any], template: Mapping[str, int],
           fused: bool = False) -> dict:
    """The original FRD test's probes through the whole head: B=3, loss = sum(ce)/B, central
    differences (of the float64 softmax-CE of the forward's logits) at 8 w1, 8 b1, 8 w2
    entries, every b2 entry of one horizon and 8 h_t entries against the two backward stages
    (``backward`` when ``fused``).
    eps 1e-3 (not the shared 1e-2) keeps the probes of this draw off the ReLU kinks; the
    smallest |pre| is reported as ``min_abs_pre``."""
    h, a = template["N_HORIZONS"], template["N_ATOMS"]
    rng = np.random.default_rng(2029)
    x = _parameters(rng, template, 3)
    labels = draw_labels(rng, (3, h), {"A": a})
    head = make_op(template)

    def loss() -> float:
        logits = head.forward(*(x[n] for n in ("h_t", "w1", "b1", "w2", "b2")))[1].get()
        return ref.frd_loss(logits, labels)

    analytic = _train_step(head, x, labels, fused)
    horizon = int(rng.integers(h))
    probes = {"w1": ref.random_indices(rng, x["w1"].shape, 8),
              "b1": ref.random_indices(rng, x["b1"].shape, 8),
              "w2": ref.random_indices(rng, x["w2"].shape, 8),
              "b2": [(horizon, i) for i in range(a)],
              "h_t": ref.random_indices(rng, x["h_t"].shape, 8)}
    out = ref.central_differences(loss, x, analytic, probes, eps=1e-3)
    pre = x["h_t"].astype(np.float64) @ x["w1"].T.astype(np.float64) + x["b1"]
    return {"parity_numgrad": {**out, "min_abs_pre": float(np.abs(pre).min())}}


def _dead_unit_head(rng: np.random.Generator, make_op: Callable[[Mapping[str, int]], Any],
                    template: Mapping[str, int], b: int) -> tuple[dict, int, Any, np.ndarray]:
    """Parameters at batch b with one unit dead on every row (b1 = -1e3), that unit, the op and
    the forward's hidden (host)."""
    x = _parameters(rng, template, b)
    dead = int(rng.integers(template["FRD_HIDDEN"]))
    x["b1"][dead] = -1e3
    head = make_op(template)
    return x, dead, head, head.forward(x["h_t"], x["w1"], x["b1"], x["w2"], x["b2"])[0].get()


def relu_mask(make_op: Callable[[Mapping[str, int]], Any], template: Mapping[str, int]) -> dict:
    """Units with pre <= 0 pass no gradient: dhidden changed only where hidden == 0 leaves
    every output of grad_w1 bitwise unchanged, and a unit that is dead on every row (b1 = -1e3)
    has exactly zero dW1 row and db1."""
    f, b = template["FRD_HIDDEN"], 70
    rng = np.random.default_rng(2030)
    x, dead, head, hidden = _dead_unit_head(rng, make_op, template, b)
    dh = rng.standard_normal((b, f), dtype=np.float32)
    moved = np.where(hidden > 0, dh, dh + rng.standard_normal((b, f), dtype=np.float32))
    first = [g.get() for g in head.grad_w1(x["h_t"], x["w1"], hidden, dh)]
    second = [g.get() for g in head.grad_w1(x["h_t"], x["w1"], hidden, moved)]
    return {"relu_mask": {
        "passed": bool(all(p.tobytes() == q.tobytes() for p, q in zip(first, second))
                       and (first[0][dead] == 0).all() and first[1][dead] == 0
                       and (hidden[:, dead] == 0).all() and (hidden == 0).any()),
        "inactive_fraction": float((hidden == 0).mean())}}


def sentinel_rows(make_op: Callable[[Mapping[str, int]], Any], template: Mapping[str, int],
                  fused: bool = False) -> dict:
    """Rows labelled -1 on every horizon add nothing to any weight gradient: redrawing their
    h_t leaves dW1, db1, dW2 and db2 bitwise unchanged, and their dh_t rows are exactly 0
    (through ``backward`` when ``fused``, else the stages)."""
    h, a, b = template["N_HORIZONS"], template["N_ATOMS"], 300
    rng = np.random.default_rng(2031)
    x = _parameters(rng, template, b)
    labels = rng.integers(0, a, size=(b, h)).astype(np.int32)
    sentinel = rng.random(b) < 0.2
    sentinel[-5:] = True  # the label stream ends with unrealised rows
    labels[sentinel] = -1
    head = make_op(template)
    first = _train_step(head, x, labels, fused)
    x["h_t"][sentinel] = rng.standard_normal((int(sentinel.sum()), x["h_t"].shape[1]),
                                             dtype=np.float32)
    second = _train_step(head, x, labels, fused)
    same = all(first[n].tobytes() == second[n].tobytes() for n in ("w1", "b1", "w2", "b2"))
    return {"sentinel_rows": {"passed": bool(same and (first["h_t"][sentinel] == 0).all()
                                             and (second["h_t"][sentinel] == 0).all()),
                              "sentinel_rows": int(sentinel.sum())}}


def dead_unit(make_op: Callable[[Mapping[str, int]], Any], template: Mapping[str, int]) -> dict:
    """The ReLU mask through ``backward``: a unit dead on every row (b1 = -1e3) has exactly
    zero dW1 row and db1, and flipping the sign of its column of w2 (which moves only its
    masked dhidden, and no row's largest |w2|: the FP16 engine's scales stay) leaves dW1, db1
    and dh_t bitwise unchanged."""
    h, a, b = template["N_HORIZONS"], template["N_ATOMS"], 70
    rng = np.random.default_rng(2032)
    x, dead, head, hidden = _dead_unit_head(rng, make_op, template, b)
    g = draw_grad_logits(rng, (b, h, a), {})
    flipped = x["w2"].copy()
    flipped[:, :, dead] *= -1
    first, second = ([v.get() for v in head.backward(x["h_t"], x["w1"], w2, hidden, g)]
                     for w2 in (x["w2"], flipped))
    layer1 = (0, 1, 4)  # grad_w1, grad_b1, grad_h_t
    return {"dead_unit": {
        "passed": bool(all(first[i].tobytes() == second[i].tobytes() for i in layer1)
                       and (first[0][dead] == 0).all() and first[1][dead] == 0
                       and (hidden[:, dead] == 0).all()),
        "inactive_fraction": float((hidden == 0).mean())}}


def oracles(make_op: Callable[[Mapping[str, int]], Any], template: Mapping[str, int]) -> dict:
    return {**parity(make_op, template), **relu_mask(make_op, template),
            **sentinel_rows(make_op, template)}


def backward_oracles(make_op: Callable[[Mapping[str, int]], Any],
                     template: Mapping[str, int]) -> dict:
    """The stages' parity and sentinel oracles through ``backward``, and its ReLU mask."""
    return {**parity(make_op, template, fused=True), **dead_unit(make_op, template),
            **sentinel_rows(make_op, template, fused=True)}


TENSORS = {"h_t": Tensor(("B", "I")), "w1": Tensor(("F", "I"), draw=draw_weights),
           "b1": Tensor(("F",)), "w2": Tensor(("H", "A", "F"), draw=draw_weights),
           "b2": Tensor(("H", "A")), "hidden": Tensor(("B", "F"), draw=draw_hidden),
           "logits": Tensor(("B", "H", "A")),
           "grad_logits": Tensor(("B", "H", "A"), draw=draw_grad_logits),
           "dhidden": Tensor(("B", "F")), "grad_w1": Tensor(("F", "I")),
           "grad_b1": Tensor(("F",)), "grad_w2": Tensor(("H", "A", "F")),
           "grad_b2": Tensor(("H", "A")), "grad_h_t": Tensor(("B", "I"))}
LOSS_TENSORS = {**TENSORS,
                 "labels": Tensor(("B", "H"), dtype="int32", draw=draw_labels),
                 "ce": Tensor(("B", "H"))}


def spec_tensor(name: str, rng: np.random.Generator, template: Mapping[str, int],
                b: int) -> np.ndarray:
    """One input of forward_loss at batch ``b``, drawn as its declaration draws it."""
    t = LOSS_TENSORS[name]
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
    """The head's peer, then ``FrdSoftmaxCE``'s."""
    hidden, logits = torch_forward(torch, h_t, w1, b1, w2, b2)
    return (hidden, logits, *torch_softmax_ce_grad(torch, logits, labels))


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


SUITE = ({"B": 1024}, {"B": 16384}, {"B": 65536})
# Odd shapes: B=1, B not a multiple of any tile, D_in and F not multiples of 4 or 32, H=1.
GRID = (({}, {"B": 1}), ({}, {"B": 333}), ({"D_IN": 37, "FRD_HIDDEN": 50}, {"B": 97}),
        ({"D_IN": 130, "FRD_HIDDEN": 19}, {"B": 300}), ({"N_HORIZONS": 1, "N_ATOMS": 11}, {"B": 5}),
        ({}, {"B": 5000}))
_COMMON_SPEC = dict(op=FrdHead, template_keys=("D_IN", "FRD_HIDDEN", "N_HORIZONS", "N_ATOMS"),
                    tensors=TENSORS, suite=SUITE, grid=GRID, oracles=oracles)

# (M, N, K) of each stage's products: layer 1 and layer 2; dW2 and dhidden; dW1 and dh_t.
FORWARD_PRODUCTS = (("B", "F", "I"), ("B", "HA", "F"))
SPECS = (
    KernelSpec(method="forward", space=FORWARD_SPACE,
               reads=("h_t", "w1", "b1", "w2", "b2"), writes=("hidden", "logits"),
               reference=ref.frdhead_forward, peer=torch_forward, products=FORWARD_PRODUCTS,
               **_COMMON_SPEC),
    KernelSpec(method="forward_loss", space=FORWARD_LOSS_SPACE,
               reads=LOSS_NAMES, writes=("hidden", "logits", "grad_logits", "ce"),
               reference=forward_loss_reference, peer=torch_forward_loss,
               products=FORWARD_PRODUCTS, fuses=("frdhead.forward", "frd.softmax_ce_grad"),
               **{**_COMMON_SPEC, "tensors": LOSS_TENSORS, "oracles": forward_loss_oracles}),
    KernelSpec(method="grad_w2", space=GRAD_W2_SPACE,
               reads=("hidden", "w2", "grad_logits"), writes=("grad_w2", "grad_b2", "dhidden"),
               reference=ref.frdhead_grad_w2, peer=torch_grad_w2,
               products=(("HA", "F", "B"), ("B", "F", "HA")), **_COMMON_SPEC),
    KernelSpec(method="grad_w1", space=GRAD_W1_SPACE,
               reads=("h_t", "w1", "hidden", "dhidden"), writes=("grad_w1", "grad_b1", "grad_h_t"),
               reference=ref.frdhead_grad_w1, peer=torch_grad_w1,
               products=(("F", "I", "B"), ("B", "I", "F")), **_COMMON_SPEC),
    KernelSpec(method="backward", space=BACKWARD_SPACE,
               reads=("h_t", "w1", "w2", "hidden", "grad_logits"),
               writes=("grad_w1", "grad_b1", "grad_w2", "grad_b2", "grad_h_t"),
               reference=backward_reference, peer=torch_backward,
               products=(("HA", "F", "B"), ("B", "F", "HA"), ("F", "I", "B"), ("B", "I", "F")),
               fuses=("frdhead.grad_w2", "frdhead.grad_w1"),
               **{**_COMMON_SPEC, "oracles": backward_oracles}),
)
