"""GPU: the per-horizon residual projection beyond test_kernels.py: its parity test's probes,
chaining into the pool's grad_ctx, bad inputs."""
import numpy as np
import pytest

import pycuda_heads as ph
from pycuda_heads import reference as ref
from pycuda_heads.core import arrays
from gpu_helpers import suite_oracles

pytestmark = pytest.mark.gpu
F32 = np.float32


def test_parity_probes_as_the_original_project():
    """B=3, H=5, D=128; loss = sum(residual); 8 w_res, all 5 bias_res, 8 ctx indices
    (test_kernels.py asserts that they pass)."""
    assert suite_oracles("residual.backward")["parity_numgrad"]["probes"] == 21


def test_chained_backward_accumulates_into_grad_ctx_without_a_new_buffer(monkeypatch):
    import pycuda.gpuarray as gpuarray
    b, k, h, d = 4, 24, 5, 128
    rng = np.random.default_rng(11)
    q, ln = rng.standard_normal((h, d), dtype=F32), rng.standard_normal((b, k, d), dtype=F32)
    w, g_res = rng.standard_normal((h, d), dtype=F32), rng.standard_normal((b, h), dtype=F32)
    g_ctx_loss = rng.standard_normal((b, h, d), dtype=F32)
    pool, proj = ph.PerHorizonAttentionPool(h, d), ph.PerHorizonResidual(h, d)
    ctx, attn = pool.forward(q, ln)
    grad_ctx = gpuarray.to_gpu(g_ctx_loss)

    sizes = []
    real_empty = arrays.empty
    record = lambda shape, *a: sizes.append(tuple(shape)) or real_empty(shape, *a)  # noqa: E731
    monkeypatch.setattr("pycuda_heads.ops.residual.empty", record)
    monkeypatch.setattr("pycuda_heads.core.arrays.empty", record)  # output_buffer's allocations
    _, _, returned = proj.backward(ctx, w, g_res, out=grad_ctx, accumulate=True)
    assert int(returned.gpudata) == int(grad_ctx.gpudata)
    # only 2-d buffers (per-block scratch rows and their sums): no [B, H, D] grad_ctx buffer
    assert sizes and all(len(s) <= 2 for s in sizes), sizes
    gq, gln = pool.backward(q, ln, attn, grad_ctx)

    _, _, ref_ctx_grad = ref.residual_backward(ctx.get(), w, g_res)
    total = g_ctx_loss + ref_ctx_grad
    np.testing.assert_allclose(grad_ctx.get(), total, rtol=1e-6, atol=1e-6)
    rq, rln = ref.pool_backward(q, ln, attn.get(), total)
    np.testing.assert_allclose(gq.get(), rq, rtol=1e-4, atol=1e-4 * np.abs(rq).max())
    np.testing.assert_allclose(gln.get(), rln, rtol=1e-4, atol=1e-4 * np.abs(rln).max())


def test_bad_inputs_raise():
    proj = ph.PerHorizonResidual(5, 128)
    ctx, w, bias = np.ones((3, 5, 128), F32), np.ones((5, 128), F32), np.ones(5, F32)
    with pytest.raises(ValueError, match=r"bias_res: expected shape \(H\) = \(5,\), got \(4,\)"):
        proj.forward(ctx, w, bias[:4])
    with pytest.raises(ValueError, match="accumulate=True needs out="):
        proj.backward(ctx, w, np.ones((3, 5), F32), accumulate=True)
    with pytest.raises(TypeError, match="out: expected a device array"):
        proj.backward(ctx, w, np.ones((3, 5), F32), out=np.zeros((3, 5, 128), F32))
    with pytest.raises(ValueError, match=r"grad_residual: expected shape \(B, H\) = \(3, 5\)"):
        proj.backward(ctx, w, np.ones((2, 5), F32))
