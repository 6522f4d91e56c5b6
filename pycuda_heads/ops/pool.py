"""Per-horizon attention pool (cu/pool.cu and the headers it includes): N_HORIZONS learned
queries attend over a layer-normed sequence ln[B, K, HIDDEN_DIM]."""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np

from .. import reference as ref
from ..core import device
from ..core.arrays import Inputs, check_aligned, empty, empty_parts
from ..core.op import HorizonOp
from ..core.sizes import HeaderSizes
from ..core.source import cu_dir
from ..core.space import KernelSpace, by_role
from ..core.spec import KernelSpec, Tensor, softmax_rows
from .reduce import reducer

# The range every shape must run in (LAYOUT 1 serves whatever LAYOUT 0, 2, 3, 4, 5 and 6 cannot).
MAX_HORIZONS, MAX_HIDDEN_DIM, MAX_K = 32, 1024, 65536

# Register rows and shared-memory regions as the kernels declare them (cu/pool_sizes.cuh; the
# row layout's ROW_PER_LANE in heads_common.cuh).
SIZES = HeaderSizes(cu_dir() / "heads_common.cuh", cu_dir() / "pool_sizes.cuh")

# Per-lane register rows. LAYOUT 0: q (and acc, or grad_ctx/q/grad_q in the backward) for every
# horizon plus UNROLL rows of ln in flight; LAYOUT 1: UNROLL rows of ln plus one (two in the
# backward) rows of q or grad_ctx. Beyond these budgets ptxas spills.
_ROW = SIZES.expr("ROW_PER_LANE")
# BLOCK stops at 512: at 1024 threads the 64-register cap spills the register rows.
_COMMON = {"BLOCK": (32, 64, 128, 256, 512), "VEC": (1, 2, 4), "UNROLL": (1, 2, 4),
           "LAYOUT": (0, 1, 2, 3, 4, 5, 6), "WGMMA": (0, 1)}
# LAYOUT 2's knobs: lanes per key, teams of warps per block (a row each), the grid (a block
# per TEAMS rows with GRID 0, else GRID blocks per SM looping over the rows: no partial last
# wave), blocks per SM the registers must allow (0: ptxas decides), ring slots per warp; keys
# per lane group a step (GROUP_KEYS, both passes, beside these) and (forward) queries in
# registers, raw scores in shared memory and lane-owned accumulators. The other layouts read
# none of them and pin each to one value.
_LAYOUT2 = {"GROUP": (8, 16, 32), "TEAMS": (1, 2, 4, 8), "GRID": (0, 1, 2, 3, 4),
            "MIN_BLOCKS": (0, 2, 3, 4), "STAGES": (2, 3, 4, 6, 8)}
_PINNED = "(GROUP, TEAMS, GRID, MIN_BLOCKS, STAGES) == (32, 1, 0, 0, 4)"
# LAYOUT 3's knob: floats of ln per shared-memory chunk (KC = CHUNK // HIDDEN_DIM keys); the
# other layouts pin it. Its tiles: TK keys a thread, T1 threads a D slice, KSPLIT slices.
_CHUNK = {"CHUNK": (2048, 4096, 8192)}
_KC, _TK, _T1 = SIZES.expr("KC"), SIZES.expr("TK"), SIZES.expr("T1")
_LAYOUT3 = (
    "LAYOUT == 3 or CHUNK == 4096",
    f"LAYOUT != 3 or ({_PINNED} and VEC == 4 and UNROLL == 1 and N_HORIZONS % 4 == 0 "
    "and HIDDEN_DIM % 4 == 0 and N_HORIZONS * HIDDEN_DIM <= 16 * BLOCK)",
    f"LAYOUT != 3 or ({_KC} >= 1 and {_KC} % {_TK} == 0 "
    f"and N_HORIZONS * {_KC} % (4 * {_TK}) == 0 and 0 < {_T1} <= BLOCK and BLOCK % {_T1} == 0 "
    f"and HIDDEN_DIM % (BLOCK // {_T1}) == 0 and HIDDEN_DIM // (BLOCK // {_T1}) % 4 == 0)")
# LAYOUT 4 (a whole row in shared memory, tensor-core products): warps of 16-key and
# 16-column tiles over horizons in n8 tiles; its grid and its minimum of blocks per SM as
# LAYOUT 2's GRID and MIN_BLOCKS (with no minimum ptxas spilled a few bytes at N_HORIZONS 8-24,
# with a minimum of 2 it did not). Up to HIDDEN_DIM 256:
# beyond, its 3xTF32 sums (one accumulator for the three products) approach the validation's
# tolerance (reports/nvidia-h200/probes/pool_wide_whole.json, H=32, D=1024).
_LAYOUT4 = (
    "LAYOUT != 4 or ((GROUP, TEAMS, STAGES) == (32, 1, 4) and VEC == 4 "
    "and UNROLL == 1 and BLOCK in (128, 256) and N_HORIZONS % 8 == 0 "
    "and HIDDEN_DIM % (BLOCK // 2) == 0 and HIDDEN_DIM <= 256)",)
# LAYOUT 5 (wide rows through a ring of 16-key slots, tensor-core products as LAYOUT 4's):
# LAYOUT 2's GRID, MIN_BLOCKS and STAGES (2-4 slots); at most 8 accumulator tiles a warp (ctx
# and GQ: 32 registers).
_LAYOUT5 = (
    "LAYOUT != 5 or ((GROUP, TEAMS) == (32, 1) and VEC == 4 and UNROLL == 1 "
    "and BLOCK in (128, 256, 512) and STAGES in (2, 3, 4) and BLOCK * MIN_BLOCKS <= 1024 "
    "and N_HORIZONS % 8 == 0 and HIDDEN_DIM % (BLOCK // 2) == 0 "
    "and HIDDEN_DIM // (BLOCK // 2) * (N_HORIZONS // 8) <= 8)",)
# LAYOUT 6 (N_HORIZONS 32, HIDDEN_DIM 128, K <= 64 on Hopper's warpgroup MMA): a warpgroup a
# row, BLOCK // 128 warpgroups a block and a block an SM, LAYOUT 2's knobs pinned. WGMMA says
# the variant is built for sm_90a, as the FRD head's knob of that name does: 1 exactly here.
_LAYOUT6 = (
    "(LAYOUT == 6) == (WGMMA == 1)",
    "LAYOUT != 6 or (N_HORIZONS == 32 and HIDDEN_DIM == 128 and BLOCK in (128, 256) "
    "and VEC == 4 and UNROLL == 1)")
_LAYOUT2_LIMITS = (
    # fewer than 64 registers a thread spill the per-lane rows
    "LAYOUT != 2 or (UNROLL == 1 and BLOCK <= 256 and TEAMS <= BLOCK // 32 "
    "and BLOCK * MIN_BLOCKS <= 1024)",
    # wider heads: the forward measured 2-3x slower than LAYOUT 1 on the H200 (a butterfly per
    # horizon and key, reports/nvidia-h200/probes/pool_forward_layouts.json); LAYOUT 1 serves them
    "LAYOUT != 2 or N_HORIZONS * HIDDEN_DIM <= 2048")
# LAYOUT 2 per lane: GCOLS columns of each row it holds.
_GCOLS = SIZES.expr("GCOLS")


def forward_shared_bytes(p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    """Dynamic shared memory of the forward at ``p`` (template constants and K in ``env``)."""
    return 4 * SIZES.value(f"POOL_FORWARD_FLOATS_L{p['LAYOUT']}", {**env, **p})


def backward_shared_bytes(p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    """Dynamic shared memory of the backward at ``p`` (template constants and K in ``env``)."""
    return 4 * SIZES.value(f"POOL_BACKWARD_FLOATS_L{p['LAYOUT']}", {**env, **p})


_LAUNCH = ("SHARED_BYTES <= MAX_SHARED_BYTES", "LAYOUT != 6 or K <= 64")

FORWARD_SPACE = KernelSpace(
    kernel="pool.forward",
    params={**_COMMON, **_LAYOUT2, "QREG": (0, 1), "SMEM_SCORES": (0, 1), "LANE_ACC": (0, 1),
            "GROUP_KEYS": (1, 2, 4), **_CHUNK},
    default={"BLOCK": 128, "VEC": 4, "UNROLL": 1, "LAYOUT": 2, "WGMMA": 0, "GROUP": 8,
             "TEAMS": 4, "GRID": 0, "MIN_BLOCKS": 0, "STAGES": 4, "QREG": 1, "SMEM_SCORES": 0,
             "LANE_ACC": 1, "GROUP_KEYS": 1, "CHUNK": 4096},
    restrictions=("HIDDEN_DIM % VEC == 0",
                  f"LAYOUT != 0 or (2 * N_HORIZONS + UNROLL) * {_ROW} <= 128",
                  f"LAYOUT != 1 or (UNROLL + 1) * {_ROW} <= 96",
                  f"LAYOUT in (2, 3, 4, 5) or {_PINNED}",
                  "LAYOUT == 2 or (QREG, LANE_ACC) == (0, 0)",
                  # scores in shared memory and lane-owned accumulators: one-warp teams only
                  # (no merge buffers there); the weights are read 4 keys at a time
                  "SMEM_SCORES == 0 or (LAYOUT == 2 and TEAMS == BLOCK // 32)",
                  "LANE_ACC == 0 or (TEAMS == BLOCK // 32 and 32 // GROUP * GROUP_KEYS % 4 == 0)",
                  "LANE_ACC == 1 or GROUP_KEYS == 1",
                  *_LAYOUT2_LIMITS, *_LAYOUT3, *_LAYOUT4, *_LAYOUT5, *_LAYOUT6,
                  # ptxas keeps about 200 of LAYOUT 2's registers for these rows before spilling:
                  # acc (and q with QREG) of every horizon and one ln step; with LANE_ACC, acc
                  # of a lane's own columns, GROUP_KEYS ln rows and their scores
                  f"LAYOUT != 2 or LANE_ACC == 1 or ((1 + QREG) * N_HORIZONS + 1) * {_GCOLS} "
                  "+ 2 * N_HORIZONS <= 200",
                  f"LANE_ACC == 0 or N_HORIZONS * {_ROW} + (QREG * N_HORIZONS + GROUP_KEYS) "
                  f"* {_GCOLS} + (GROUP_KEYS + 2) * N_HORIZONS <= 200"),
    # beyond 8 KB a warp the scores buffer costs blocks per SM
    launch_restrictions=(*_LAUNCH, "SMEM_SCORES == 0 or N_HORIZONS * K <= 2048"),
    shared_bytes=forward_shared_bytes)

BACKWARD_SPACE = KernelSpace(
    kernel="pool.backward", params={**_COMMON, **_LAYOUT2, "GROUP_KEYS": (1, 2), **_CHUNK},
    # MIN_BLOCKS 3 lets ptxas use up to 168 registers: left to itself it picks 134 and the
    # B=1024,K=128 backward runs 14% slower (same occupancy, less latency hidden)
    default={"BLOCK": 128, "VEC": 4, "UNROLL": 1, "LAYOUT": 2, "WGMMA": 0, "GROUP": 16,
             "TEAMS": 4, "GRID": 0, "MIN_BLOCKS": 3, "STAGES": 4, "GROUP_KEYS": 1,
             "CHUNK": 4096},
    restrictions=("HIDDEN_DIM % VEC == 0",
                  f"LAYOUT != 0 or (3 * N_HORIZONS + UNROLL) * {_ROW} <= 128",
                  f"LAYOUT != 1 or (UNROLL + 2) * {_ROW} <= 96",
                  # the 128-register cap of 512 threads spills LAYOUT 1's wide rows
                  f"LAYOUT != 1 or BLOCK < 512 or (UNROLL + 2) * {_ROW} <= 32",
                  f"LAYOUT in (2, 3, 4, 5) or {_PINNED}",
                  "LAYOUT == 2 or GROUP_KEYS == 1",
                  *_LAYOUT2_LIMITS, *_LAYOUT3, *_LAYOUT4, *_LAYOUT5, *_LAYOUT6,
                  # per lane: grad_ctx and the grad_q_h partial of every horizon, a query row,
                  # and an ln row and a grad_ln row for each of the GROUP_KEYS keys; 168 fit
                  # the registers of MIN_BLOCKS 3, and with no minimum ptxas holds 226 (H=2,
                  # D=1024 at GROUP 32: 254 registers, no spill; its backward ran 43.6 us
                  # against LAYOUT 1's 66.3, reports/nvidia-h200/probes/pool_wide_backward.json)
                  f"LAYOUT != 2 or (2 * N_HORIZONS + 1 + 2 * GROUP_KEYS) * {_GCOLS} "
                  "+ N_HORIZONS <= (226 if MIN_BLOCKS == 0 else 168)"),
    launch_restrictions=_LAUNCH, shared_bytes=backward_shared_bytes)


_NULL = np.intp(0)  # grad_attn, ctx or the ds scratch absent

FORWARD_INPUTS = Inputs(ln=("B", "K", "D"), q_h=("H", "D"))
# grad_attn and ctx are optional (None)
BACKWARD_INPUTS = Inputs(ln=("B", "K", "D"), q_h=("H", "D"), attn=("B", "H", "K"),
                         grad_ctx=("B", "H", "D"), grad_attn=("B", "H", "K"),
                         ctx=("B", "H", "D"))


def _check_keys(k: int) -> None:
    if k > MAX_K:
        raise ValueError(f"PerHorizonAttentionPool: K must be at most {MAX_K}, got {k}")


# Split-K: a row of many keys in a small batch runs as SPLIT virtual rows of K/SPLIT keys (the
# layouts' grid is one block or team per row, too few blocks for B=64, K=4096): the layouts,
# compiled with SPLIT_COUNT, read and write the batch rows' attn in place, and pool_split.cuh
# joins the splits' softmaxes. The split doubles while the batch has fewer than SPLIT_ROWS
# rows, K divides and a virtual row keeps SPLIT_KEYS keys or more: on the H200, B=64, K=4096
# ran fwd+bwd in 143.7 us at 16 splits (rows of 256 keys), 155.3 at 32, 177.3 at 64 and 222.1
# at 8 (reports/nvidia-h200/probes/pool_splitk_virtual.json).
SPLIT_ROWS, SPLIT_KEYS = 1024, 256
_SPLIT_THREADS, _SPLIT_MAX, _SPLIT_SPAN = (
    SIZES.value(n, {}) for n in ("SPLIT_THREADS", "SPLIT_MAX", "SPLIT_SPAN"))


def split_count(b: int, k: int) -> int:
    """Virtual rows a batch row of ``k`` keys runs as (1: no split)."""
    s = 1
    while (b * s < SPLIT_ROWS and s < _SPLIT_MAX and k % (2 * s) == 0
           and k // (2 * s) >= SPLIT_KEYS):
        s *= 2
    return s


def _split_defines(s: int) -> dict[str, int] | None:
    """The layouts' compile-time split count at ``s`` splits (None: rows run whole)."""
    return {"SPLIT_COUNT": s} if s > 1 else None


def _blocks(p: Mapping[str, Any], b: int) -> int:
    """One block per batch row; in LAYOUT 2 one per TEAMS rows; in LAYOUT 2, 4 and 5 at most
    GRID per SM; in LAYOUT 6 one per BLOCK // 128 rows, at most one per SM."""
    if p["LAYOUT"] == 6:
        return min(-(-b // (p["BLOCK"] // 128)), device.sm_count())
    if p["LAYOUT"] not in (2, 4, 5):
        return b
    blocks = -(-b // p["TEAMS"])
    return min(blocks, p["GRID"] * device.sm_count()) if p["GRID"] else blocks


class PerHorizonAttentionPool(HorizonOp):
    """ctx, attn = pool.forward(q_h, ln); grad_q_h, grad_ln = pool.backward(q_h, ln, attn, grad_ctx).

    Runs every N_HORIZONS <= 32, HIDDEN_DIM <= 1024 and K <= 65536; shapes the default launch
    cannot hold fall back to its nearest valid point (LAYOUT 1 holds any shape in the range).

    ``launch={"forward": {...}, "backward": {...}}`` overrides the tuned or default launch
    parameters; ``chosen`` tells which were used by the last call and where they came from.
    """

    FAMILY = "pool"
    SPACES = by_role(FORWARD_SPACE, BACKWARD_SPACE)
    PDL = True

    def __init__(self, n_horizons: int, hidden_dim: int,
                 launch: Mapping[str, Mapping[str, Any]] | None = None):
        for name, value, top in (("n_horizons", n_horizons, MAX_HORIZONS),
                                 ("hidden_dim", hidden_dim, MAX_HIDDEN_DIM)):
            if isinstance(value, int) and not isinstance(value, bool) and value > top:
                raise ValueError(f"{type(self).__name__}: {name} must be at most {top}, "
                                 f"got {value}")
        super().__init__(n_horizons, hidden_dim, launch)
        self.scale = 1.0 / math.sqrt(hidden_dim)
        self._scale = np.float32(self.scale)

    def forward(self, q_h: Any, ln: Any, *, stream: Any = None) -> tuple[Any, Any]:
        """ctx[B, H, D] and attn[B, H, K] as GPUArrays (launched on ``stream``). Long rows in a
        small batch run split (``split_count``)."""
        (ln, q_h), dims = FORWARD_INPUTS.adapt(self._checked, self.bound, ln, q_h)
        b, k, h, d = dims["B"], dims["K"], dims["H"], dims["D"]
        _check_keys(k)
        s = split_count(b, k)
        bv, kv = b * s, k // s  # the rows the layout runs: virtual ones where split
        plan = self.plan("forward", {"B": b, "K": k}, lambda p: (
            (_blocks(p, bv), 1, 1), (p["BLOCK"], 1, 1),
            forward_shared_bytes(p, {**self.template, "K": kv})), _split_defines(s))
        check_aligned(plan.params["VEC"], q_h=q_h, ln=ln)
        ctx, attn = empty((b, h, d)), empty((b, h, k))
        # split: each split's weights in place in attn; its ctx, and right behind the splits'
        # ctx rows its log-sum-exp, until the combine (pool_common.cuh)
        ctx_v, lse = (ctx, None) if s == 1 else empty_parts((bv, h, d), (b, h, s), align=4)
        plan.kernel(plan.grid, plan.block, q_h=q_h.gpudata, ln=ln.gpudata, ctx=ctx_v.gpudata,
                    attn=attn.gpudata, K=kv, scale=self._scale, B=bv, shared=plan.shared,
                    stream=stream)
        if s > 1:
            self._join("combine")((h, b, -(-k // _SPLIT_SPAN)), (_SPLIT_THREADS, 1, 1),
                                  ctx_v=ctx_v.gpudata, lse=lse.gpudata, ctx=ctx.gpudata,
                                  attn=attn.gpudata, S=s, Ks=kv, stream=stream)
        return ctx, attn

    def backward(self, q_h: Any, ln: Any, attn: Any, grad_ctx: Any, ctx: Any = None, *,
                 grad_attn: Any = None, stream: Any = None) -> tuple[Any, Any]:
        """grad_q_h[H, D] and grad_ln[B, K, D]; grad_attn[B, H, K] is optional (zero). Given
        the forward's ctx[B, H, D] (positionally or as ``ctx=``), the softmax correction comes
        from grad_ctx . ctx and ln is read once, not twice; long rows in a small batch then
        run split as in the forward (without ctx they do not: the split needs the row's)."""
        (ln, q_h, attn, grad_ctx, grad_attn, ctx), dims = BACKWARD_INPUTS.adapt(
            self._checked, self.bound, ln, q_h, attn, grad_ctx, grad_attn, ctx)
        b, k, h, d = dims["B"], dims["K"], dims["H"], dims["D"]
        _check_keys(k)
        s = 1 if ctx is None else split_count(b, k)
        bv, kv = b * s, k // s
        plan = self.plan("backward", {"B": b, "K": k}, lambda p: (
            (_blocks(p, bv), 1, 1), (p["BLOCK"], 1, 1),
            backward_shared_bytes(p, {**self.template, "K": kv})), _split_defines(s))
        check_aligned(plan.params["VEC"], q_h=q_h, ln=ln, grad_ctx=grad_ctx,
                      **({} if ctx is None else {"ctx": ctx}))
        blocks = plan.grid[0]  # one grad_q_h scratch row each
        # split with grad_attn: each batch row's sum_k attn * grad_attn, which every split's
        # correction takes whole, rides behind the blocks' rows (pool_common.cuh)
        grad_ln = empty((b, k, d))
        if s > 1 and grad_attn is not None:
            scratch, dot = empty_parts((blocks, h * d), (b, h), align=4)
            self._join("attn_dot")((h, b, 1), (_SPLIT_THREADS, 1, 1), attn=attn.gpudata,
                                   grad_attn=grad_attn.gpudata, attn_dot=dot.gpudata, K=k,
                                   stream=stream)
        else:
            scratch = empty((blocks, h * d))
        ds = empty((bv, h, kv)) if plan.params["LAYOUT"] == 1 else None
        plan.kernel(plan.grid, plan.block, q_h=q_h.gpudata, ln=ln.gpudata, attn=attn.gpudata,
                    grad_ctx=grad_ctx.gpudata,
                    grad_attn=_NULL if grad_attn is None else grad_attn.gpudata,
                    ctx=_NULL if ctx is None else ctx.gpudata, grad_ln=grad_ln.gpudata,
                    gq_scratch=scratch.gpudata, ds_scratch=_NULL if ds is None else ds.gpudata,
                    K=kv, scale=self._scale, B=bv, shared=plan.shared, stream=stream)
        return reducer().sum_rows(scratch, blocks, h * d, stream, (h, d)), grad_ln

    def _join(self, role: str) -> Any:
        """Split-K's kernel ``pool_<role>`` (pool.cu with POOL_SPLIT)."""
        return self.kernel(role, {"POOL_SPLIT": 1})


def torch_forward(torch: Any, q_h: Any, ln: Any) -> tuple[Any, Any]:
    scale = 1.0 / math.sqrt(q_h.shape[1])
    attn = torch.softmax(scale * torch.matmul(q_h, ln.transpose(1, 2)), dim=-1)  # [B, H, K]
    return torch.matmul(attn, ln), attn


def torch_backward(torch: Any, q_h: Any, ln: Any, attn: Any, grad_ctx: Any,
                   ctx: Any = None) -> tuple[Any, Any]:
    """torch's own backward of the same math (autograd needs no ctx)."""
    scale = 1.0 / math.sqrt(q_h.shape[1])
    dw = torch.matmul(grad_ctx, ln.transpose(1, 2))  # [B, H, K]
    ds = attn * (dw - (attn * dw).sum(dim=-1, keepdim=True))
    grad_q_h = scale * torch.einsum("bhk,bkd->hd", ds, ln)
    grad_ln = (torch.matmul(attn.transpose(1, 2), grad_ctx)
               + scale * torch.matmul(ds.transpose(1, 2), q_h))
    return grad_q_h, grad_ln


def parity(make_op: Callable[[Mapping[str, int]], Any], template: Mapping[str, int]) -> dict:
    """The original project's parity test: B=2, K=8, loss = sum(ctx), central differences of
    the forward kernel at 8 random q_h and 8 random ln entries against the backward kernel."""
    h, d = template["N_HORIZONS"], template["HIDDEN_DIM"]
    rng = np.random.default_rng(2024)
    x = {"q_h": rng.standard_normal((h, d), dtype=np.float32),
         "ln": rng.standard_normal((2, 8, d), dtype=np.float32)}
    pool = make_op(template)

    def loss() -> float:
        return float(pool.forward(x["q_h"], x["ln"])[0].get().astype(np.float64).sum())

    _, attn = pool.forward(x["q_h"], x["ln"])
    gq, gln = pool.backward(x["q_h"], x["ln"], attn, np.ones((2, h, d), np.float32))
    analytic = {"q_h": gq.get(), "ln": gln.get()}
    probes = {n: ref.random_indices(rng, v.shape, 8) for n, v in x.items()}
    return {"parity_numgrad": ref.central_differences(loss, x, analytic, probes)}


def _forward_ctx(x: Mapping[str, np.ndarray]) -> np.ndarray:
    return np.matmul(x["attn"].astype(np.float64), x["ln"].astype(np.float64))


TENSORS = {"q_h": Tensor(("H", "D")), "ln": Tensor(("B", "K", "D")),
           "attn": Tensor(("B", "H", "K"), draw=softmax_rows), "grad_ctx": Tensor(("B", "H", "D")),
           # the backward's ctx is the forward's: attn @ ln of the inputs drawn before it
           "ctx": Tensor(("B", "H", "D"), derive=_forward_ctx), "grad_q_h": Tensor(("H", "D")),
           "grad_ln": Tensor(("B", "K", "D"))}
# Three are wide model sizes (their own N_HORIZONS / HIDDEN_DIM).
SUITE = ({"B": 2, "K": 8}, {"B": 256, "K": 64}, {"B": 1024, "K": 128}, {"B": 4096, "K": 64},
         {"B": 4096, "K": 256},
         {"N_HORIZONS": 8, "HIDDEN_DIM": 512, "B": 1024, "K": 128},
         {"N_HORIZONS": 2, "HIDDEN_DIM": 1024, "B": 256, "K": 64},
         {"B": 64, "K": 4096},
         {"N_HORIZONS": 32, "HIDDEN_DIM": 128, "B": 512, "K": 64})
# Odd shapes: K=1, K not a multiple of the block, K in the thousands, B=1, H=1, D=64/96/256;
# D not a multiple of 4, D=1024, H=32, K=65536 and K past LAYOUT 0's shared memory.
GRID = (({}, {"B": 1, "K": 1}), ({}, {"B": 3, "K": 33}), ({}, {"B": 2, "K": 257}),
        ({}, {"B": 2, "K": 4096}), ({"N_HORIZONS": 1}, {"B": 4, "K": 16}),
        ({"HIDDEN_DIM": 64}, {"B": 3, "K": 20}), ({"HIDDEN_DIM": 256}, {"B": 2, "K": 40}),
        ({"N_HORIZONS": 3, "HIDDEN_DIM": 96}, {"B": 2, "K": 77}),
        ({"N_HORIZONS": 3, "HIDDEN_DIM": 30}, {"B": 2, "K": 19}),
        ({"N_HORIZONS": 1, "HIDDEN_DIM": 30}, {"B": 1, "K": 65536}),
        ({"N_HORIZONS": 2, "HIDDEN_DIM": 1024}, {"B": 1, "K": 1}),
        ({"N_HORIZONS": 32, "HIDDEN_DIM": 1024}, {"B": 2, "K": 9}),
        ({"N_HORIZONS": 32, "HIDDEN_DIM": 30}, {"B": 3, "K": 1}),
        ({}, {"B": 1, "K": 6000}))
_COMMON_SPEC = dict(op=PerHorizonAttentionPool, template_keys=("N_HORIZONS", "HIDDEN_DIM"),
                    tensors=TENSORS, suite=SUITE, grid=GRID, oracles=parity)

SPECS = (
    KernelSpec(method="forward", space=FORWARD_SPACE, reads=("q_h", "ln"),
               writes=("ctx", "attn"), reference=ref.pool_forward, peer=torch_forward,
               **_COMMON_SPEC),
    KernelSpec(method="backward", space=BACKWARD_SPACE,
               reads=("q_h", "ln", "attn", "grad_ctx", "ctx"), writes=("grad_q_h", "grad_ln"),
               reference=ref.pool_backward, peer=torch_backward, **_COMMON_SPEC),
)
