"""GPU checks of one kernel variant: agreement with the references, every output written,
bitwise determinism, and each op's parity test (the original project's numerical-gradient
tests) or analytical oracles. A variant counts only when all of them pass."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from .arrays import poisoned_outputs
from .cases import Case, op_kwargs
from .registry import KERNELS

F32 = np.float32
EPS32 = float(np.finfo(F32).eps)
# Kernel error may be this multiple of the float32 NumPy reference's own error against float64
# (the flash-attention rule): both accumulate in float32, in different orders.
REF_ERR_MULTIPLE = 16.0
# ... or this fraction of the output's largest magnitude, for outputs where the float32 reference
# happens to be nearly exact (a sum of few terms); a wrong index or a race errs by O(1).
REL_FLOOR = 1e-5
# The original project's parity tests: central differences at +-1e-2 of the forward kernel,
# pass within 5e-2 relative or 5e-3 absolute.
PARITY_EPS, PARITY_RTOL, PARITY_ATOL = 1e-2, 5e-2, 5e-3


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
    checks: dict[str, dict[str, Any]] = {}
    try:
        with poisoned_outputs():
            first = [o.get() for o in case.launch()]
        for name, out, r64, r32 in zip(case.output_names(), first, case.reference(np.float64),
                                       case.reference(F32)):
            checks[f"reference.{name}"] = compare(out, r64, r32)
        second = [o.get() for o in case.launch()]
        same = all(a.tobytes() == b.tobytes() for a, b in zip(first, second))
        checks["determinism"] = {"passed": same}
        checks.update(VARIANT_CHECKS[case.kernel.split(".")[0]](case))
    except Exception as exc:  # a broken variant is a failed check, never a crashed sweep
        checks["error"] = {"passed": False, "detail": f"{type(exc).__name__}: {exc}"}
    failures = [f"{k}: {v.get('detail', v)}" for k, v in checks.items() if not v["passed"]]
    rel = [v["max_rel_err"] for v in checks.values() if "max_rel_err" in v]
    return {"passed": not failures, "failures": failures, "checks": checks,
            "max_rel_err": max(rel) if rel else None}


def _op(case: Case, template: Mapping[str, int] | None = None) -> Any:
    template = template or case.template
    return case.info.op(**op_kwargs(case.kernel, template), launch={case.info.role: case.params})


def _numgrad_check(loss: Callable[[], float], arrays: dict[str, np.ndarray],
                   analytic: dict[str, np.ndarray], probes: dict[str, list[tuple]]) -> dict[str, Any]:
    """Central differences of ``loss`` (which reads ``arrays``) at ``probes`` vs ``analytic``."""
    worst_rel, worst_abs, ok = 0.0, 0.0, True
    for name, idxs in probes.items():
        x = arrays[name]
        for i in idxs:
            old = x[i]
            x[i] = old + F32(PARITY_EPS)
            hi = loss()
            x[i] = old - F32(PARITY_EPS)
            lo = loss()
            x[i] = old
            num, ana = (hi - lo) / (2 * PARITY_EPS), float(analytic[name][i])
            err = abs(num - ana)
            rel = err / max(abs(num), 1e-30)
            ok &= err <= PARITY_ATOL or rel <= PARITY_RTOL
            worst_rel, worst_abs = max(worst_rel, min(rel, 1e30)), max(worst_abs, err)
    return {"passed": bool(ok), "max_rel_err_numgrad": worst_rel, "max_abs_err_numgrad": worst_abs,
            "probes": sum(len(v) for v in probes.values())}


def _random_indices(rng: np.random.Generator, shape: tuple, n: int) -> list[tuple]:
    return [tuple(int(rng.integers(s)) for s in shape) for _ in range(n)]


def pool_checks(case: Case) -> dict[str, Any]:
    """Parity test: B=2, K=8, loss = sum(ctx), 8 random q_h and 8 random ln indices."""
    h, d = case.template["N_HORIZONS"], case.template["HIDDEN_DIM"]
    rng = np.random.default_rng(2024)
    x = {"q_h": rng.standard_normal((h, d), dtype=F32), "ln": rng.standard_normal((2, 8, d), dtype=F32)}
    pool = _op(case)

    def loss() -> float:
        return float(pool.forward(x["q_h"], x["ln"])[0].get().astype(np.float64).sum())

    _, attn = pool.forward(x["q_h"], x["ln"])
    gq, gln = pool.backward(x["q_h"], x["ln"], attn, np.ones((2, h, d), F32))
    analytic = {"q_h": gq.get(), "ln": gln.get()}
    probes = {n: _random_indices(rng, v.shape, 8) for n, v in x.items()}
    return {"parity_numgrad": _numgrad_check(loss, x, analytic, probes)}


def residual_checks(case: Case) -> dict[str, Any]:
    """Parity test: B=3, loss = sum(residual), 8 w_res, all bias_res and 8 ctx indices."""
    h, d = case.template["N_HORIZONS"], case.template["HIDDEN_DIM"]
    rng = np.random.default_rng(2025)
    x = {"ctx": rng.standard_normal((3, h, d), dtype=F32),
         "w_res": rng.standard_normal((h, d), dtype=F32),
         "bias_res": rng.standard_normal(h, dtype=F32)}
    proj = _op(case)

    def loss() -> float:
        return float(proj.forward(x["ctx"], x["w_res"], x["bias_res"]).get().astype(np.float64).sum())

    gw, gb, gctx = proj.backward(x["ctx"], x["w_res"], np.ones((3, h), F32))
    analytic = {"w_res": gw.get(), "bias_res": gb.get(), "ctx": gctx.get()}
    probes = {"w_res": _random_indices(rng, (h, d), 8), "bias_res": [(i,) for i in range(h)],
              "ctx": _random_indices(rng, (3, h, d), 8)}
    return {"parity_numgrad": _numgrad_check(loss, x, analytic, probes)}


def gate_checks(case: Case) -> dict[str, Any]:
    """A closed gate (alpha = 0) returns the head bitwise; central differences of the forward
    match grad_head, grad_residual and grad_alpha for alpha in [-2, 2]."""
    h = case.template["N_HORIZONS"]
    rng = np.random.default_rng(2026)
    b = 64
    x = {"head": rng.standard_normal((b, h), dtype=F32),
         "residual": rng.standard_normal((b, h), dtype=F32),
         "alpha": rng.uniform(-2, 2, h).astype(F32)}
    g = rng.standard_normal((b, h), dtype=F32)
    gate = _op(case)
    closed = gate.forward(x["head"], x["residual"], np.zeros(h, F32)).get()

    def loss() -> float:
        out = gate.forward(x["head"], x["residual"], x["alpha"]).get().astype(np.float64)
        return float((g * out).sum())

    gh, gr, ga = (a.get() for a in gate.backward(x["residual"], x["alpha"], g))
    probes = {"head": _random_indices(rng, (b, h), 8), "residual": _random_indices(rng, (b, h), 8),
              "alpha": [(i,) for i in range(h)]}
    return {"closed_gate_bitwise": {"passed": closed.tobytes() == x["head"].tobytes()},
            "parity_numgrad": _numgrad_check(loss, x, {"head": gh, "residual": gr, "alpha": ga},
                                             probes)}


def frd_checks(case: Case) -> dict[str, Any]:
    """The analytical oracles: uniform logits give ce = ln(A) and zero-sum gradient rows;
    sentinel rows are exactly zero and leave their neighbours bitwise unchanged; finite
    differences of ce match the gradient."""
    h, a = case.template["N_HORIZONS"], case.template["N_ATOMS"]
    b = 64
    rng = np.random.default_rng(2027)
    frd = _op(case)
    out: dict[str, Any] = {}

    labels = rng.integers(0, a, size=(b, h)).astype(np.int32)
    grad, ce = (v.get() for v in frd.softmax_ce_grad(np.full((b, h, a), 0.75, F32), labels))
    ce_err = float(np.abs(ce.astype(np.float64) - np.log(a)).max())
    row_sum = float(np.abs(grad.astype(np.float64).sum(axis=-1)).max())
    out["uniform_logits"] = {"passed": ce_err <= 8 * EPS32 * np.log(a) and row_sum <= 4 * a * EPS32 / b,
                             "max_abs_err_ce": ce_err, "max_abs_grad_row_sum": row_sum}

    logits = (3 * rng.standard_normal((b, h, a))).astype(F32)
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
    # for ce < 16) over 2e-3 limits the estimate to ~1e-3 in units of B*grad, so probes take atoms
    # with |p - onehot| >= 0.5 (mostly label atoms), where that stays under the 5e-3 relative
    # tolerance; every atom's gradient is checked against the float64 reference instead.
    eps, worst = 1e-3, 0.0
    p_minus = g_all.astype(np.float64) * b
    probes = [(i, j, k) for i, j, k in zip(*np.nonzero(np.abs(p_minus) >= 0.5))]
    picks = [probes[i] for i in rng.choice(len(probes), size=min(8, len(probes)), replace=False)]
    for i, j, k in picks:
        x = logits.copy()
        x[i, j, k] += F32(eps)
        hi = float(frd.softmax_ce_grad(x, labels)[1].get()[i, j])
        x[i, j, k] = logits[i, j, k] - F32(eps)
        lo = float(frd.softmax_ce_grad(x, labels)[1].get()[i, j])
        num = (hi - lo) / (2 * eps) / b
        worst = max(worst, abs(num - float(g_all[i, j, k])) / abs(float(g_all[i, j, k])))
    out["finite_differences"] = {"passed": bool(picks) and worst <= 5e-3,
                                 "max_rel_err_numgrad": worst, "probes": len(picks)}
    return out


def reduce_checks(case: Case) -> dict[str, Any]:
    """Small integers sum exactly in float32: the result must equal the integer sum."""
    rng = np.random.default_rng(2028)
    n, m = case.shape["N"], case.shape["M"]
    x = rng.integers(-8, 9, size=(n, m)).astype(F32)
    y = _op(case)(x).get()
    return {"exact_integer_sum": {"passed": bool((y == x.astype(np.int64).sum(axis=0)).all())}}


VARIANT_CHECKS: dict[str, Callable[[Case], dict[str, Any]]] = {
    "pool": pool_checks, "residual": residual_checks, "gate": gate_checks, "frd": frd_checks,
    "reduce_axis0": reduce_checks,
}
assert set(VARIANT_CHECKS) == {k.split(".")[0] for k in KERNELS}
