"""GPU: the fused residual + gate beyond test_kernels.py: other launch parameters and the shipped
tuned entries, its oracles' probes, negative zero through a closed gate, the unfused ops,
chaining into grad_ctx, the reduce skipped for one row group, bad inputs, PDL."""
import json

import numpy as np
import pytest

import pycuda_heads as ph
from pycuda_heads import reference as ref
from pycuda_heads.core import arrays
from pycuda_heads.core.tuned import TABLE_DIR
from gpu_helpers import assert_pdl_gives_plain_bits, assert_variant_passes, oracles, suite_oracles

pytestmark = pytest.mark.gpu
F32 = np.float32
H, D = 5, 128
SUITE = {"N_HORIZONS": H, "HIDDEN_DIM": D}

# Points of each space beside the default: a group per row, unroll tails, one strip wider than
# the row; B=1001 leaves a partial last group and a partial last unroll step.
FORWARD_VARIANTS = [{"BLOCK": 32, "ROWS": 1, "VEC": 1}, {"BLOCK": 64, "ROWS": 8, "VEC": 4},
                    {"BLOCK": 512, "ROWS": 16, "VEC": 2}]
BACKWARD_VARIANTS = [{"BLOCK": 32, "ROWS": 1, "VEC": 4, "UNROLL": 1},
                     {"BLOCK": 64, "ROWS": 4, "VEC": 2, "UNROLL": 4},
                     {"BLOCK": 128, "ROWS": 64, "VEC": 1, "UNROLL": 8},
                     {"BLOCK": 256, "ROWS": 256, "VEC": 4, "UNROLL": 2}]


def _tuned(kernel):
    """(template, shape, params) of every shipped tuned entry of ``kernel``."""
    return [pytest.param(e["template"], e["shape"], e["params"], id=f"{path.stem}-{e['shape']}")
            for path in sorted(TABLE_DIR.glob("*.json"))
            for e in json.loads(path.read_text())["entries"] if e["kernel"] == kernel]


def _inputs(b, h=H, d=D, seed=5):
    rng = np.random.default_rng(seed)
    return {"ctx": rng.standard_normal((b, h, d), dtype=F32),
            "w_res": rng.standard_normal((h, d), dtype=F32),
            "bias_res": rng.standard_normal(h, dtype=F32),
            "head": rng.standard_normal((b, h), dtype=F32),
            "alpha": rng.uniform(-2, 2, h).astype(F32),
            "grad_out": rng.standard_normal((b, h), dtype=F32)}


@pytest.mark.parametrize("params", FORWARD_VARIANTS, ids=str)
def test_forward_variants_match_reference(params):
    assert_variant_passes("resgate.forward", SUITE, {"B": 1001}, params)


@pytest.mark.parametrize("params", BACKWARD_VARIANTS, ids=str)
def test_backward_variants_match_reference(params):
    assert_variant_passes("resgate.backward", SUITE, {"B": 1001}, params)
    assert oracles("resgate.backward", params=params)["parity_numgrad"]["passed"]


@pytest.mark.parametrize("template,shape,params", _tuned("resgate.forward"))
def test_tuned_forward_variants_pass(template, shape, params):
    assert_variant_passes("resgate.forward", template, shape, params)


@pytest.mark.parametrize("template,shape,params", _tuned("resgate.backward"))
def test_tuned_backward_variants_pass(template, shape, params):
    assert_variant_passes("resgate.backward", template, shape, params)


def test_central_differences_probe_every_input_and_the_closed_gate_is_checked():
    """B=3, H=5, D=128; loss = sum(g * out); probes in every input of the forward
    (test_kernels.py asserts that the oracles pass)."""
    checks = suite_oracles("resgate.backward")
    assert checks["parity_numgrad"]["probes"] == 8 + 8 + H + 8 + H
    assert "closed_gate_bitwise" in checks


def test_closed_gate_keeps_negative_zero_and_large_values():
    rg = ph.ResidualGate(H, D)
    x = _inputs(3)
    head = np.array([[-0.0, 1e30, -3.5, 7.0, 1e-38]] * 3, F32)
    out, residual = rg.forward(x["ctx"] * F32(1e20), x["w_res"], x["bias_res"], head,
                               np.zeros(H, F32))
    assert out.get().tobytes() == head.tobytes()
    assert np.abs(residual.get()).max() > 1e18


def test_forward_is_bitwise_the_unfused_ops_and_backward_grad_ctx_too():
    x = _inputs(1000)
    rg = ph.ResidualGate(H, D, launch={"forward": {"VEC": 4}, "backward": {"VEC": 4}})
    proj = ph.PerHorizonResidual(H, D, launch={"forward": {"VEC": 4}})
    gate = ph.AlphaGate(H)
    out, residual = rg.forward(x["ctx"], x["w_res"], x["bias_res"], x["head"], x["alpha"])
    r_unfused = proj.forward(x["ctx"], x["w_res"], x["bias_res"])
    assert residual.get().tobytes() == r_unfused.get().tobytes()
    assert out.get().tobytes() == gate.forward(x["head"], r_unfused, x["alpha"]).get().tobytes()

    import pycuda.gpuarray as gpuarray
    grad_out = gpuarray.to_gpu(x["grad_out"])
    gw, gb, gctx, gh, ga = rg.backward(x["ctx"], x["w_res"], x["alpha"], residual, grad_out)
    assert int(gh.gpudata) == int(grad_out.gpudata)  # passed through, not copied
    _, g_res, ga_unfused = gate.backward(residual, x["alpha"], grad_out)
    gw_unfused, gb_unfused, gctx_unfused = proj.backward(x["ctx"], x["w_res"], g_res)
    assert gctx.get().tobytes() == gctx_unfused.get().tobytes()
    for fused, unfused in ((gw, gw_unfused), (gb, gb_unfused), (ga, ga_unfused)):
        np.testing.assert_allclose(fused.get(), unfused.get(), rtol=1e-5, atol=1e-4)


def test_one_row_group_skips_the_reduce_and_more_groups_use_one(monkeypatch):
    from pycuda_heads.ops import reduce as reduce_mod
    calls = []
    real = reduce_mod.ReduceAxis0.sum_rows
    monkeypatch.setattr(reduce_mod.ReduceAxis0, "sum_rows",
                        lambda self, x, n, m, *rest: calls.append((n, m))
                        or real(self, x, n, m, *rest))
    rg = ph.ResidualGate(H, D, launch={"backward": {"ROWS": 16}})
    for b in (3, 16, 1000):
        x = _inputs(b)
        _, residual = rg.forward(x["ctx"], x["w_res"], x["bias_res"], x["head"], x["alpha"])
        gw, gb, gctx, _, ga = rg.backward(x["ctx"], x["w_res"], x["alpha"], residual,
                                          x["grad_out"])
        want = ref.resgate_backward(x["ctx"], x["w_res"], x["alpha"], residual.get(),
                                    x["grad_out"])
        for got, r in zip((gw, gb, gctx, ga), (want[0], want[1], want[2], want[4])):
            np.testing.assert_allclose(got.get(), r, rtol=1e-4, atol=1e-4 * np.abs(r).max())
    assert calls == [(63, H * D + 2 * H)]


def test_chained_backward_accumulates_into_grad_ctx_without_a_new_buffer(monkeypatch):
    import pycuda.gpuarray as gpuarray
    b = 37
    x = _inputs(b)
    g_ctx_loss = np.random.default_rng(12).standard_normal((b, H, D), dtype=F32)
    rg = ph.ResidualGate(H, D)
    _, residual = rg.forward(x["ctx"], x["w_res"], x["bias_res"], x["head"], x["alpha"])
    grad_ctx = gpuarray.to_gpu(g_ctx_loss)

    xd = {k: gpuarray.to_gpu(v) for k, v in x.items()}  # no uploads inside the call
    sizes = []  # bytes of every allocation the backward makes
    pool = arrays.allocator()
    monkeypatch.setattr(arrays, "allocator", lambda: lambda n: sizes.append(n) or pool(n))
    _, _, returned, _, _ = rg.backward(xd["ctx"], xd["w_res"], xd["alpha"], residual,
                                       xd["grad_out"], out=grad_ctx, accumulate=True)
    assert int(returned.gpudata) == int(grad_ctx.gpudata)
    assert sizes and max(sizes) < 4 * b * H * D, sizes  # scratch rows only, no grad_ctx
    want = ref.resgate_backward(x["ctx"], x["w_res"], x["alpha"], residual.get(),
                                x["grad_out"])[2]
    np.testing.assert_allclose(grad_ctx.get(), g_ctx_loss + want, rtol=1e-6, atol=1e-6)


def test_bad_inputs_raise():
    rg = ph.ResidualGate(H, D)
    x = _inputs(3)
    with pytest.raises(ValueError, match=r"head: expected shape \(B, H\) = \(3, 5\)"):
        rg.forward(x["ctx"], x["w_res"], x["bias_res"], x["head"][:2], x["alpha"])
    with pytest.raises(ValueError, match=r"alpha: expected shape \(H\) = \(5,\), got \(4,\)"):
        rg.forward(x["ctx"], x["w_res"], x["bias_res"], x["head"], x["alpha"][:4])
    residual = x["head"]
    with pytest.raises(ValueError, match="accumulate=True needs out="):
        rg.backward(x["ctx"], x["w_res"], x["alpha"], residual, x["grad_out"], accumulate=True)
    with pytest.raises(TypeError, match="out: expected a device array"):
        rg.backward(x["ctx"], x["w_res"], x["alpha"], residual, x["grad_out"],
                    out=np.zeros((3, H, D), F32))
    with pytest.raises(ValueError, match=r"grad_out: expected shape \(B, H\) = \(3, 5\)"):
        rg.backward(x["ctx"], x["w_res"], x["alpha"], residual, x["grad_out"][:2])
    with pytest.raises(ValueError, match="breaks the restriction 'UNROLL <= ROWS'"):
        ph.ResidualGate(H, D, launch={"backward": {"ROWS": 1, "UNROLL": 4}})


@pytest.mark.parametrize("b", [3, 1000])
def test_programmatic_dependent_launches_give_the_bits_of_plain_launches(monkeypatch, b):
    """A chain where every launch reads what the one before it wrote (each forward's head is
    the last out; each backward reads that forward's residual and out) gives, launched with
    programmatic dependent launch, the bits of the same chain launched plainly."""
    import pycuda.gpuarray as gpuarray
    x = {k: gpuarray.to_gpu(v) for k, v in _inputs(b).items()}

    def chain():
        rg, out, grads = ph.ResidualGate(H, D), x["head"], []
        for _ in range(20):
            out, residual = rg.forward(x["ctx"], x["w_res"], x["bias_res"], out, x["alpha"])
            grads += rg.backward(x["ctx"], x["w_res"], x["alpha"], residual, out)
        return rg, [out, *grads]

    assert_pdl_gives_plain_bits(monkeypatch, chain)
