"""FRD softmax + cross-entropy gradient over return atoms (cu/frd.cu).
Label -1 marks a horizon whose return is not realised yet: zero loss and zero gradient."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from .. import reference as ref
from ..core import deferred
from ..core.arrays import Inputs, check_aligned, empty
from ..core.op import Op
from ..core.space import KernelSpace, by_role
from ..core.spec import KernelSpec, Tensor, draw_labels


def shared_bytes(p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    return 4 * (p["BLOCK"] // p["TPR"]) * env["N_ATOMS"] if p["LAYOUT"] == 1 and p["STAGE"] else 0


# LAYOUT 0 is the original block-per-row design (its other knobs are pinned to one value so it
# is one point of the space); LAYOUT 1 puts TPR lanes on a row and BLOCK/TPR rows in a block;
# LAYOUT 2 is warp-local streaming, CPW chunks of 32 rows per warp.
SPACE = KernelSpace(
    kernel="frd.softmax_ce_grad",
    params={"LAYOUT": (0, 1, 2), "TPR": (1, 2, 4, 8, 16, 32), "BLOCK": (64, 128, 256, 512),
            "STAGE": (0, 1), "CPW": (1, 2, 4, 8)},
    default={"LAYOUT": 0, "TPR": 1, "BLOCK": 64, "STAGE": 0, "CPW": 1},
    restrictions=("LAYOUT != 0 or (TPR == 1 and BLOCK == 64 and STAGE == 0)",
                  "LAYOUT != 0 or N_ATOMS <= 1024",
                  "(N_ATOMS + TPR - 1) // TPR <= 64",
                  "TPR < 2 * N_ATOMS",
                  "LAYOUT == 2 or CPW == 1",
                  "LAYOUT != 2 or (TPR == 1 and STAGE == 0 and N_ATOMS <= 64)",
                  # LAYOUT 2's static tiles: BLOCK/32 warps x 32 rows x odd stride floats
                  "LAYOUT != 2 or BLOCK // 32 * 32 * (N_ATOMS // 2 * 2 + 1) * 4 <= 48 * 1024"),
    launch_restrictions=("SHARED_BYTES <= MAX_SHARED_BYTES", "LAYOUT != 0 or N_HORIZONS <= 65535"),
    shared_bytes=shared_bytes,
)


INPUTS = Inputs(logits=("B", "H", "A"), labels=(("B", "H"), np.int32))


class FrdSoftmaxCE(Op):
    """grad_logits, ce = frd.softmax_ce_grad(logits, labels)."""

    FAMILY = "frd"
    SPACES = by_role(SPACE)

    def __init__(self, n_horizons: int, n_atoms: int = 21,
                 launch: Mapping[str, Mapping[str, Any]] | None = None):
        super().__init__({"N_HORIZONS": n_horizons, "N_ATOMS": n_atoms}, launch)
        self.n_horizons, self.n_atoms = n_horizons, n_atoms
        self._bound = {"H": n_horizons, "A": n_atoms}

    def softmax_ce_grad(self, logits: Any, labels: Any, *, check_labels: bool = True,
                        stream: Any = None) -> tuple[Any, Any]:
        """grad_logits[B, H, A] = (softmax - onehot) / B and raw per-row ce[B, H].

        Labels are int32 in [-1, N_ATOMS); a bad label's row and loss always come out NaN.
        NumPy labels are checked before anything is launched. Device labels are checked on the
        device, without a synchronisation: the ValueError naming the first bad position is
        raised by the next ``softmax_ce_grad`` call that finds the check finished, and at the
        latest by ``pycuda_heads.synchronize()``. ``check_labels=False`` skips that check.
        """
        if deferred.pending():
            deferred.poll()
        host_labels = labels if isinstance(labels, np.ndarray) else None
        (logits, labels), dims = INPUTS.adapt(self._checked, self._bound, logits, labels)
        if host_labels is not None:
            self._check_labels(host_labels)
        b = dims["B"]
        rows = b * self.n_horizons
        plan = self.plan("softmax_ce_grad", {"B": b}, lambda p: self._geometry(p, b))
        if host_labels is None and check_labels:
            self._check_device_labels(labels, rows, plan.params, stream)
        if plan.params["LAYOUT"] == 1 and plan.params["STAGE"]:
            check_aligned(4, logits=logits)  # the staged copy uses float4 loads
        grad, ce = empty((b, self.n_horizons, self.n_atoms)), empty((b, self.n_horizons))
        plan.kernel(plan.grid, plan.block, logits=logits.gpudata, labels=labels.gpudata,
                    grad=grad.gpudata, ce=ce.gpudata, rows=rows, inv_b=1.0 / b,
                    shared=plan.shared, stream=stream)
        return grad, ce

    def _geometry(self, p: Mapping[str, Any], b: int) -> tuple[tuple, tuple, int]:
        """(grid, block, shared bytes) of each layout at batch ``b``."""
        rows = b * self.n_horizons
        if p["LAYOUT"] == 0:
            return (b, self.n_horizons, 1), (self.n_atoms, 1, 1), 0
        if p["LAYOUT"] == 2:
            per_block = p["BLOCK"] // 32 * p["CPW"] * 32  # rows per block
            return (-(-rows // per_block), 1, 1), (p["BLOCK"], 1, 1), 0
        rpb = p["BLOCK"] // p["TPR"]
        return (-(-rows // rpb), 1, 1), (p["BLOCK"], 1, 1), shared_bytes(p, self.template)

    def synchronize(self) -> None:
        """Wait for the GPU and raise the error of any failed device label check."""
        deferred.synchronize()

    def _check_labels(self, labels: np.ndarray) -> None:
        if labels.dtype != np.int32:
            raise TypeError(f"labels: expected dtype int32, got {labels.dtype}")
        bad = (labels < -1) | (labels >= self.n_atoms)
        if bad.any():
            pos = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(self._bad_label(pos, int(labels[pos])))

    def _bad_label(self, pos: tuple[int, ...], value: int) -> str:
        return (f"labels{list(pos)} = {value} is outside [-1, {self.n_atoms}) (-1 marks a "
                f"horizon not realised yet)")

    def _check_device_labels(self, labels: Any, rows: int, params: Mapping[str, Any],
                             stream: Any) -> None:
        blocks = min(-(-rows // _CHECK_PER_BLOCK), _CHECK_MAX_BLOCKS)
        per_block = -(-rows // blocks)
        event, host, ptr = deferred.slots(2 * blocks)
        self.kernel("check_labels", params)(
            (blocks, 1, 1), (_CHECK_BLOCK, 1, 1), labels=labels.gpudata, first_bad=ptr, n=rows,
            per_block=per_block, stream=stream)
        h = self.n_horizons

        def describe(found: np.ndarray) -> str | None:
            first = found[0::2].tolist()
            if max(first) < 0:
                return None
            i = next(i for i, at in enumerate(first) if at >= 0)
            return "device " + self._bad_label(divmod(first[i], h), int(found[2 * i + 1]))

        deferred.submit(event, host, 2 * blocks, stream, describe)


# The device label check: CHECK_BLOCK threads (as in cu/frd.cu) per block, a few thousand labels
# per block, and a bounded number of result slots.
_CHECK_BLOCK = 256
_CHECK_PER_BLOCK = 4096
_CHECK_MAX_BLOCKS = 1024


def draw_logits(rng: np.random.Generator, shape: tuple, dims: Mapping[str, int]) -> np.ndarray:
    """N(0, 3^2) logits with a few extreme rows: +-1e4 spreads, all equal, one huge atom."""
    logits = (3 * rng.standard_normal(shape)).astype(np.float32)
    flat = logits.reshape(-1, shape[-1])
    rows, a = flat.shape
    if rows >= 4:
        flat[rows // 4] = rng.choice([-1e4, 1e4], size=a)
        flat[rows // 2] = 0.5
        flat[3 * rows // 4, rng.integers(a)] = 1e4
    return logits


def torch_softmax_ce_grad(torch: Any, logits: Any, labels: Any) -> tuple[Any, Any]:
    # Rows flattened to [B*H, A]: torch's 3-d cross-entropy path takes atomics (nll_loss2d).
    b, h, a = logits.shape
    flat, lab = logits.reshape(b * h, a), labels.reshape(b * h).long()
    live = lab >= 0
    safe = lab.clamp_min(0)
    p = torch.softmax(flat, dim=-1)
    p_label = p.gather(1, safe.unsqueeze(1)).squeeze(1)
    ce = torch.where(live, -torch.log(p_label.clamp_min(ref.CE_FLOOR)), 0.0)
    onehot = torch.nn.functional.one_hot(safe, a).to(p.dtype)
    grad = torch.where(live.unsqueeze(1), (p - onehot) / b, 0.0)
    return grad.reshape(b, h, a), ce.reshape(b, h)


def oracles(make_op: Callable[[Mapping[str, int]], Any], template: Mapping[str, int]) -> dict:
    """Uniform logits give ce = ln(A) and zero-sum gradient rows; sentinel rows are exactly
    zero and leave their neighbours bitwise unchanged; finite differences of ce match the
    gradient."""
    h, a, b = template["N_HORIZONS"], template["N_ATOMS"], 64
    eps32 = float(np.finfo(np.float32).eps)
    rng = np.random.default_rng(2027)
    frd = make_op(template)
    out: dict[str, Any] = {}

    labels = rng.integers(0, a, size=(b, h)).astype(np.int32)
    grad, ce = (v.get() for v in frd.softmax_ce_grad(np.full((b, h, a), 0.75, np.float32), labels))
    ce_err = float(np.abs(ce.astype(np.float64) - np.log(a)).max())
    row_sum = float(np.abs(grad.astype(np.float64).sum(axis=-1)).max())
    out["uniform_logits"] = {"passed": ce_err <= 8 * eps32 * np.log(a)
                             and row_sum <= 4 * a * eps32 / b,
                             "max_abs_err_ce": ce_err, "max_abs_grad_row_sum": row_sum}

    logits = (3 * rng.standard_normal((b, h, a))).astype(np.float32)
    sentinel = rng.random((b, h)) < 0.3
    mixed = np.where(sentinel, -1, labels).astype(np.int32)
    g_mix, ce_mix = (v.get() for v in frd.softmax_ce_grad(logits, mixed))
    g_all, ce_all = (v.get() for v in frd.softmax_ce_grad(logits, labels))
    out["sentinel_rows"] = {
        "passed": bool((g_mix[sentinel] == 0).all() and (ce_mix[sentinel] == 0).all()
                       and g_mix[~sentinel].tobytes() == g_all[~sentinel].tobytes()
                       and ce_mix[~sentinel].tobytes() == ce_all[~sentinel].tobytes()),
        "sentinel_rows": int(sentinel.sum())}

    # Finite differences of ce[b,h]/B at +-1e-3. float32 rounding of ce (one ulp, up to ~1e-6
    # for ce < 16) over 2e-3 limits the estimate to ~1e-3 in units of B*grad, so probes take
    # atoms with |p - onehot| >= 0.5 (mostly label atoms), where that stays under the 5e-3
    # relative tolerance; every atom's gradient is compared with the float64 reference instead.
    eps, worst = 1e-3, 0.0
    probes = list(zip(*np.nonzero(np.abs(g_all.astype(np.float64) * b) >= 0.5)))
    picks = [probes[i] for i in rng.choice(len(probes), size=min(8, len(probes)), replace=False)]
    for i, j, k in picks:
        x = logits.copy()
        x[i, j, k] += np.float32(eps)
        hi = float(frd.softmax_ce_grad(x, labels)[1].get()[i, j])
        x[i, j, k] = logits[i, j, k] - np.float32(eps)
        lo = float(frd.softmax_ce_grad(x, labels)[1].get()[i, j])
        num = (hi - lo) / (2 * eps) / b
        worst = max(worst, abs(num - float(g_all[i, j, k])) / abs(float(g_all[i, j, k])))
    out["finite_differences"] = {"passed": bool(picks) and worst <= 5e-3,
                                 "max_rel_err_numgrad": worst, "probes": len(picks)}
    return out


SPECS = (
    # One fused pass computes the loss and its gradient: the benchmark reports it as fwd+bwd.
    KernelSpec(op=FrdSoftmaxCE, method="softmax_ce_grad", space=SPACE,
               template_keys=("N_HORIZONS", "N_ATOMS"),
               tensors={"logits": Tensor(("B", "H", "A"), draw=draw_logits),
                        "labels": Tensor(("B", "H"), dtype="int32", draw=draw_labels),
                        "grad_logits": Tensor(("B", "H", "A")), "ce": Tensor(("B", "H"))},
               reads=("logits", "labels"), writes=("grad_logits", "ce"),
               reference=ref.frd_softmax_ce_grad, peer=torch_softmax_ce_grad, oracles=oracles,
               # labels are drawn valid; the optional device label check is not the kernel
               call_kwargs={"check_labels": False}, bench_pass="fwd+bwd",
               suite=({"B": 1024}, {"B": 16384}, {"B": 262144}),
               grid=(({}, {"B": 1}), ({}, {"B": 3}), ({"N_ATOMS": 11}, {"B": 37}),
                     ({"N_ATOMS": 51}, {"B": 37}), ({"N_HORIZONS": 1}, {"B": 5}))),
)
