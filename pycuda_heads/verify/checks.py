"""GPU checks of one kernel variant: agreement with the references, every output written,
bitwise determinism, and the kernel's own parity test or analytical oracles. A variant counts
only when all of them pass."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..core.arrays import poisoned_outputs
from .cases import Case

# Kernel error may be this multiple of the float32 NumPy reference's own error against float64
# (``compare``: the larger of this bound and REL_FLOOR's). Both accumulate in float32 but in
# different orders (a warp tree against NumPy's pairwise sum), so the kernel's error is not
# bounded by 2x of one particular float32 order (flash-attention's multiple). A chosen margin,
# not a measured worst: a wrong index or a race errs by orders of magnitude more.
REF_ERR_MULTIPLE = 16.0
# ... or this fraction of the output's largest magnitude, whichever is larger: the float32
# reference's own error is often far below it, so this floor sets most outputs' tolerance; a
# wrong index or a race errs by O(1).
REL_FLOOR = 1e-5


def compare(out: np.ndarray, ref64: np.ndarray, ref32: np.ndarray) -> dict[str, Any]:
    """Error of a kernel output against the float64 reference, scaled by the float32 one."""
    written = bool(np.isfinite(out).all()) or not np.isfinite(ref64).all()
    err = float(np.abs(out.astype(np.float64) - ref64).max())
    ref_err = float(np.abs(ref32.astype(np.float64) - ref64).max())
    scale = float(np.abs(ref64).max()) or 1.0
    tol = max(REF_ERR_MULTIPLE * ref_err, REL_FLOOR * scale)
    return {"passed": written and err <= tol, "all_written": written, "max_abs_err": err,
            "max_rel_err": err / scale, "ref32_abs_err": ref_err, "tolerance": tol}


def validate_case(case: Case) -> dict[str, Any]:
    """Every check of ``case``'s variant at its shape, plus its parity test or oracles."""
    spec = case.spec
    checks: dict[str, dict[str, Any]] = {}
    try:
        with poisoned_outputs():
            first = [o.get() for o in case.launch()]
        for name, out, r64, r32 in zip(spec.writes, first, case.reference(np.float64),
                                       case.reference(np.float32)):
            checks[f"reference.{name}"] = compare(out, r64, r32)
        second = [o.get() for o in case.launch()]
        same = all(a.tobytes() == b.tobytes() for a, b in zip(first, second))
        checks["determinism"] = {"passed": same}
        if spec.oracles is not None:
            checks.update(spec.oracles(lambda t: spec.make_op(t, case.params), case.template))
    except Exception as exc:  # a broken variant is a failed check, never a crashed sweep
        checks["error"] = {"passed": False, "detail": f"{type(exc).__name__}: {exc}"}
    failures = [f"{k}: {v.get('detail', v)}" for k, v in checks.items() if not v["passed"]]
    rel = [v["max_rel_err"] for v in checks.values() if "max_rel_err" in v]
    return {"passed": not failures, "failures": failures, "checks": checks,
            "max_rel_err": max(rel) if rel else None}
