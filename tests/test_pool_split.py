"""CPU: the pool's split-K. Which shapes split; the joins' math (pool_split.cuh) in float64 on
the reference's virtual rows gives the whole rows' results; the joins compile free of atomics
and spills."""
import shutil

import numpy as np
import pytest

from pycuda_heads import reference as ref
from pycuda_heads.catalog import SUITE_TEMPLATE, catalog
from pycuda_heads.ops.pool import SPLIT_KEYS, SPLIT_ROWS, split_count


def test_only_long_rows_in_small_batches_split():
    spec = catalog()["pool.forward"]
    split = {(s["B"], s["K"]) for _, s in spec.suite_points(SUITE_TEMPLATE)
             if split_count(s["B"], s["K"]) > 1}
    assert split == {(64, 4096)}
    assert split_count(64, 4096) == 16 and split_count(2, 65536) == 256
    for b, k in ((1, 65536), (3, 6000), (7, 4096), (1000, 1 << 16), (1, 257), (2, 1024)):
        s = split_count(b, k)
        assert k % s == 0 and (s == 1 or (k // s >= SPLIT_KEYS and b * s // 2 < SPLIT_ROWS))


def _layouts_backward(q, ln, attn, gc, ctx, ga_v, ga_dot):
    """The layouts' backward on virtual rows given the batch row's ctx: the correction is
    grad_ctx . ctx plus the batch row's sum attn * grad_attn (pool_attn_dot's, the same for
    every split of a row)."""
    dw = gc @ ln.transpose(0, 2, 1) + (0 if ga_v is None else ga_v)
    c = (gc * ctx).sum(-1) + (0 if ga_dot is None else ga_dot)
    ds = attn * (dw - c[..., None])
    scale = 1 / np.sqrt(q.shape[1])
    grad_ln = attn.transpose(0, 2, 1) @ gc + scale * ds.transpose(0, 2, 1) @ q
    return scale * (ds @ ln).sum(0), grad_ln


def _joined(q, ln, gc, ga, s):
    """The forward on virtual rows with each split's log-sum-exp, pool_combine, pool_attn_dot,
    then the backward on the virtual rows (each split reading the batch row's attn, grad_attn,
    grad_ctx and ctx in place), all in float64 (the reference plays the layouts)."""
    b, k, d = ln.shape
    h, kv = q.shape[0], k // s
    lnv = ln.reshape(b * s, kv, d)
    ctx_v, attn_v = ref.pool_forward(q, lnv)
    ctx_v, attn_v = ctx_v.reshape(b, s, h, d), attn_v.reshape(b, s, h, kv)
    scores = (lnv @ q.T / np.sqrt(d)).reshape(b, s, kv, h)
    top = scores.max(axis=2)
    lse = top + np.log(np.exp(scores - top[:, :, None]).sum(axis=2))  # [b, s, h]
    w = np.exp(lse - lse.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)  # [b, s, h]
    ctx = (w[..., None] * ctx_v).sum(axis=1)
    attn = (w[..., None] * attn_v).transpose(0, 2, 1, 3).reshape(b, h, k)
    split = lambda x: (x.reshape(b, h, s, kv).transpose(0, 2, 1, 3)  # noqa: E731
                       .reshape(b * s, h, kv))
    batch_row = lambda x: np.repeat(x[:, None], s, axis=1).reshape(b * s, h, -1)  # noqa: E731
    ga_v = ga_dot = None
    if ga is not None:
        ga_v = split(ga)
        ga_dot = batch_row((attn * ga).sum(-1)[..., None])[..., 0]
    gq, gln = _layouts_backward(q, lnv, split(attn), batch_row(gc), batch_row(ctx), ga_v, ga_dot)
    return ctx, attn, gq, gln.reshape(b, k, d)


@pytest.mark.parametrize("peaked", [False, True])
@pytest.mark.parametrize("with_grad_attn", [False, True])
def test_the_joins_give_the_whole_rows_results(peaked, with_grad_attn):
    """Exact up to float64 rounding, also when one split holds nearly all of a row's weight."""
    rng = np.random.default_rng(7)
    b, k, h, d, s = 3, 96, 4, 16, 8
    q = rng.standard_normal((h, d)) * (6 if peaked else 1)
    ln, gc = rng.standard_normal((b, k, d)), rng.standard_normal((b, h, d))
    ga = rng.standard_normal((b, h, k)) if with_grad_attn else None
    ctx, attn, gq, gln = _joined(q, ln, gc, ga, s)
    want_ctx, want_attn = ref.pool_forward(q, ln)
    want_gq, want_gln = ref.pool_backward(q, ln, want_attn, gc, grad_attn=ga)
    for got, want in ((ctx, want_ctx), (attn, want_attn), (gq, want_gq), (gln, want_gln)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
@pytest.mark.parametrize("h,d", [(5, 128), (32, 1024), (1, 30)])
def test_the_joins_compile_free_of_atomics_and_spills(h, d):
    from pycuda_heads.verify.static_check import check_variant
    report = check_variant("pool", {"N_HORIZONS": h, "HIDDEN_DIM": d, "POOL_SPLIT": 1})
    assert set(report.entries) == {"pool_combine", "pool_attn_dot"}
    assert report.ok, report.problems()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
@pytest.mark.parametrize("layout", [0, 1, 2, 3, 4, 5])
@pytest.mark.parametrize("kernel", ["pool.forward", "pool.backward"])
def test_the_layouts_compile_split_free_of_atomics_and_spills(kernel, layout):
    """Each layout compiled with SPLIT_COUNT (attn read and written in place, the batch row's
    grad_ctx and ctx, attn_dot), at its valid point nearest the default."""
    from pycuda_heads.verify.static_check import check_kernel
    spec = catalog()[kernel]
    # LAYOUT 3 takes N_HORIZONS % 4 == 0; LAYOUT 4 and 5 N_HORIZONS % 8 == 0
    template = {"N_HORIZONS": 32 if layout in (4, 5) else 4, "HIDDEN_DIM": 128}
    params = spec.space.complete({"LAYOUT": layout}, template)
    report = check_kernel(spec, {**params, "SPLIT_COUNT": 16}, template=template)
    assert report.ok, report.problems()
