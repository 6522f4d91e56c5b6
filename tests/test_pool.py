"""GPU: the per-horizon attention pool beyond test_kernels.py: other launch parameters and
layouts, the ctx= and grad_attn= backward, launch overrides, bad inputs, torch arrays, PDL."""
import numpy as np
import pytest

import pycuda_heads as ph
from pycuda_heads import reference as ref
from gpu_helpers import assert_pdl_gives_plain_bits, assert_variant_passes, suite_oracles

pytestmark = pytest.mark.gpu
F32 = np.float32


def test_parity_probes_as_the_original_project():
    """B=2, K=8, D=128, H=5; loss = sum(ctx); central differences of the forward kernel at 16
    entries (test_kernels.py asserts that they pass)."""
    assert suite_oracles("pool.backward")["parity_numgrad"]["probes"] == 16


def test_grad_attn_is_added():
    rng = np.random.default_rng(5)
    q, ln = rng.standard_normal((5, 128), dtype=F32), rng.standard_normal((3, 19, 128), dtype=F32)
    gc, ga = rng.standard_normal((3, 5, 128), dtype=F32), rng.standard_normal((3, 5, 19), dtype=F32)
    pool = ph.PerHorizonAttentionPool(5, 128)
    _, attn = pool.forward(q, ln)
    gq, gln = pool.backward(q, ln, attn, gc, grad_attn=ga)
    rq, rln = ref.pool_backward(q, ln, attn.get(), gc, grad_attn=ga)
    np.testing.assert_allclose(gq.get(), rq, rtol=1e-4, atol=1e-4 * np.abs(rq).max())
    np.testing.assert_allclose(gln.get(), rln, rtol=1e-4, atol=1e-4 * np.abs(rln).max())


@pytest.mark.parametrize("params", [{"BLOCK": 32, "VEC": 1, "UNROLL": 1},
                                    {"BLOCK": 512, "VEC": 2, "UNROLL": 4}])
def test_other_launch_parameters_agree(params):
    for kernel in ("pool.forward", "pool.backward"):
        assert_variant_passes(kernel, {"N_HORIZONS": 5, "HIDDEN_DIM": 128}, {"B": 3, "K": 45}, params)


def test_launch_override_is_reported():
    """BLOCK 256 beside the default's 4 teams: two-warp teams, so the accumulators are no longer
    lane-owned (LANE_ACC needs one-warp teams); every other knob keeps the default's value."""
    pool = ph.PerHorizonAttentionPool(5, 128, launch={"forward": {"BLOCK": 256}})
    pool.forward(np.ones((5, 128), F32), np.ones((1, 4, 128), F32))
    assert pool.chosen["forward"] == {
        "params": {"BLOCK": 256, "VEC": 4, "UNROLL": 1, "LAYOUT": 2, "WGMMA": 0, "GROUP": 8,
                   "TEAMS": 4, "GRID": 0, "MIN_BLOCKS": 0, "STAGES": 4, "QREG": 1,
                   "SMEM_SCORES": 0, "LANE_ACC": 0, "GROUP_KEYS": 1, "CHUNK": 4096},
        "source": "user"}


def test_a_partial_launch_gets_its_layouts_values():
    """{"LAYOUT": 0} beside LAYOUT 2's default: the other knobs come from a valid LAYOUT 0 point."""
    pool = ph.PerHorizonAttentionPool(5, 128, launch={"forward": {"LAYOUT": 0}})
    pool.forward(np.ones((5, 128), F32), np.ones((1, 4, 128), F32))
    params = pool.chosen["forward"]["params"]
    assert params["LAYOUT"] == 0 and (params["GROUP"], params["TEAMS"], params["QREG"]) == (32, 1, 0)


def test_bad_inputs_raise_before_launch():
    pool = ph.PerHorizonAttentionPool(5, 128)
    q, ln = np.ones((5, 128), F32), np.ones((2, 8, 128), F32)
    with pytest.raises(ValueError, match=r"q_h: expected shape \(H, D\) = \(5, 128\), got \(4, 128\)"):
        pool.forward(q[:4], ln)
    with pytest.raises(TypeError, match="ln: expected dtype float32, got float64"):
        pool.forward(q, ln.astype(np.float64))
    with pytest.raises(ValueError, match="ln: expected a C-contiguous array"):
        pool.forward(q, np.ones((2, 128, 8), F32).transpose(0, 2, 1))
    with pytest.raises(ValueError, match=r"ln: expected a 3-d array \(B, K, D\)"):
        pool.forward(q, ln[0])
    with pytest.raises(TypeError, match="q_h: expected a NumPy array"):
        pool.forward(q.tolist(), ln)
    with pytest.raises(ValueError, match="K must be at most 65536"):
        pool.forward(q, np.ones((1, 100_000, 128), F32))
    with pytest.raises(ValueError, match="SHARED_BYTES <= MAX_SHARED_BYTES"):
        ph.PerHorizonAttentionPool(5, 128, launch={"forward": {"LAYOUT": 0}}).forward(
            q, np.ones((1, 60_000, 128), F32))
    _, attn = pool.forward(q, ln)
    with pytest.raises(ValueError, match=r"grad_ctx: expected shape \(B, H, D\) = \(2, 5, 128\)"):
        pool.backward(q, ln, attn, np.ones((3, 5, 128), F32))
    with pytest.raises(ValueError, match="unknown launch parameter 'BLOKC'"):
        ph.PerHorizonAttentionPool(5, 128, launch={"forward": {"BLOKC": 64}})
    with pytest.raises(ValueError, match="HIDDEN_DIM % VEC == 0"):
        ph.PerHorizonAttentionPool(5, 30, launch={"forward": {"VEC": 4}})


def test_odd_hidden_dim_falls_back_to_a_valid_default():
    pool = ph.PerHorizonAttentionPool(2, 30)
    rng = np.random.default_rng(0)
    q, ln = rng.standard_normal((2, 30), dtype=F32), rng.standard_normal((2, 9, 30), dtype=F32)
    ctx, _ = pool.forward(q, ln)
    np.testing.assert_allclose(ctx.get(), ref.pool_forward(q, ln)[0], rtol=1e-5, atol=1e-5)
    assert 30 % pool.chosen["forward"]["params"]["VEC"] == 0


def test_cuda_array_interface_inputs_are_zero_copy():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    q, ln = rng.standard_normal((5, 128), dtype=F32), rng.standard_normal((2, 8, 128), dtype=F32)
    pool = ph.PerHorizonAttentionPool(5, 128)
    tq, tln = torch.from_numpy(q).cuda(), torch.from_numpy(ln).cuda()
    torch.cuda.synchronize()
    ctx_t, _ = pool.forward(tq, tln)
    ctx_n, _ = pool.forward(q, ln)
    assert ctx_t.get().tobytes() == ctx_n.get().tobytes()
    with pytest.raises(ValueError, match="C-contiguous"):
        pool.forward(tq, tln.transpose(1, 2))


# --- LAYOUT 1 (any N_HORIZONS <= 32, HIDDEN_DIM <= 1024, K <= 65536) and the ctx= backward ---

@pytest.mark.parametrize("template,shape", [
    ({"N_HORIZONS": 5, "HIDDEN_DIM": 128}, {"B": 3, "K": 45}),
    ({"N_HORIZONS": 3, "HIDDEN_DIM": 30}, {"B": 2, "K": 19}),
    ({"N_HORIZONS": 1, "HIDDEN_DIM": 1}, {"B": 1, "K": 1}),
    ({"N_HORIZONS": 32, "HIDDEN_DIM": 1024}, {"B": 1, "K": 33}),
    ({"N_HORIZONS": 8, "HIDDEN_DIM": 512}, {"B": 4, "K": 128}),
    ({"N_HORIZONS": 2, "HIDDEN_DIM": 1000}, {"B": 2, "K": 5001})])
@pytest.mark.parametrize("params", [{"LAYOUT": 1, "BLOCK": 32, "VEC": 1, "UNROLL": 1},
                                    {"LAYOUT": 1, "BLOCK": 256, "VEC": 1, "UNROLL": 2}])
def test_layout_1_matches_reference(template, shape, params):
    for kernel in ("pool.forward", "pool.backward"):
        space = ph.PerHorizonAttentionPool.SPACES[kernel.split(".")[1]]
        point = space.complete(params, template)
        assert_variant_passes(kernel, template, shape, space.nearest(point, template, shape))


@pytest.mark.parametrize("h,d,b,k,forward,backward", [
    (8, 256, 2, 64, 2, 2), (32, 128, 2, 17, 1, 4), (5, 128, 1, 60000, 2, 2), (2, 1024, 3, 20, 2, 2)])
def test_shapes_the_default_cannot_hold_run_on_its_nearest_layout(h, d, b, k, forward, backward):
    pool = ph.PerHorizonAttentionPool(h, d)
    rng = np.random.default_rng(7)
    q, ln = rng.standard_normal((h, d), dtype=F32), rng.standard_normal((b, k, d), dtype=F32)
    ctx, attn = pool.forward(q, ln)
    gq, gln = pool.backward(q, ln, attn, np.ones((b, h, d), F32), ctx=ctx)
    assert pool.chosen["forward"]["params"]["LAYOUT"] == forward
    assert pool.chosen["backward"]["params"]["LAYOUT"] == backward
    rc, ra = ref.pool_forward(q, ln)
    np.testing.assert_allclose(ctx.get(), rc, rtol=1e-4, atol=1e-4 * np.abs(rc).max())
    np.testing.assert_allclose(attn.get(), ra, rtol=1e-4, atol=1e-4 * np.abs(ra).max())
    rq, rln = ref.pool_backward(q, ln, attn.get(), np.ones((b, h, d), F32))
    np.testing.assert_allclose(gln.get(), rln, rtol=1e-4, atol=1e-4 * np.abs(rln).max())


# --- LAYOUT 2: lane groups, cp.async ring, teams, persistent grid, register caps ---

_L2 = {"LAYOUT": 2}


@pytest.mark.parametrize("template,shape", [
    ({"N_HORIZONS": 5, "HIDDEN_DIM": 128}, {"B": 7, "K": 45}),      # rows past B, a partial step
    ({"N_HORIZONS": 5, "HIDDEN_DIM": 128}, {"B": 2, "K": 1}),
    ({"N_HORIZONS": 5, "HIDDEN_DIM": 128}, {"B": 300, "K": 20}),    # GRID 1, 2: rows loop
    ({"N_HORIZONS": 3, "HIDDEN_DIM": 30}, {"B": 5, "K": 19}),       # no 16-byte copies
    ({"N_HORIZONS": 1, "HIDDEN_DIM": 1}, {"B": 3, "K": 70}),
    ({"N_HORIZONS": 16, "HIDDEN_DIM": 128}, {"B": 3, "K": 33}),
    ({"N_HORIZONS": 2, "HIDDEN_DIM": 1024}, {"B": 2, "K": 9}),
    ({"N_HORIZONS": 1, "HIDDEN_DIM": 30}, {"B": 1, "K": 65536})])
@pytest.mark.parametrize("params", [
    {}, {"LANE_ACC": 0}, {"LANE_ACC": 0, "QREG": 1}, {"SMEM_SCORES": 1},
    {"GROUP_KEYS": 2, "STAGES": 3}, {"GROUP_KEYS": 4, "STAGES": 2, "QREG": 0},
    {"GROUP": 16, "GROUP_KEYS": 2, "TEAMS": 4}, {"GROUP": 16, "TEAMS": 2},
    {"GROUP": 16, "GROUP_KEYS": 2, "TEAMS": 2}, {"GROUP": 8, "GROUP_KEYS": 2, "MIN_BLOCKS": 2},
    {"GROUP": 32, "TEAMS": 1, "GRID": 1},
    {"BLOCK": 256, "TEAMS": 2, "GRID": 4}, {"BLOCK": 64, "TEAMS": 1, "VEC": 1, "GRID": 2}],
    ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "default")
@pytest.mark.parametrize("kernel", ["pool.forward", "pool.backward"])
def test_layout_2_matches_reference(template, shape, params, kernel):
    space = ph.PerHorizonAttentionPool.SPACES[kernel.split(".")[1]]
    # the passes share the matrix: each takes the knobs and values its space has
    point = space.complete({**_L2, **{k: v for k, v in params.items()
                                      if v in space.params.get(k, ())}}, template)
    if space.violated(point, template, shape):
        point = space.nearest(point, template, shape)
    if point["LAYOUT"] != 2:  # the backward's per-lane rows outgrow LAYOUT 2 at H=2, D=1024
        assert kernel == "pool.backward" and template["HIDDEN_DIM"] == 1024, point
    assert_variant_passes(kernel, template, shape, point)


@pytest.mark.parametrize("params", [{"LAYOUT": 2, "MIN_BLOCKS": 4, "BLOCK": 128, "GROUP": 16},
                                    {"LAYOUT": 2, "MIN_BLOCKS": 2, "BLOCK": 256, "GROUP": 32,
                                     "TEAMS": 8, "GRID": 1}])
def test_layout_2_register_caps_agree(params):
    """Registers capped for more blocks per SM (ptxas may spill): the same results."""
    for kernel in ("pool.forward", "pool.backward"):
        space = ph.PerHorizonAttentionPool.SPACES[kernel.split(".")[1]]
        template, shape = {"N_HORIZONS": 5, "HIDDEN_DIM": 128}, {"B": 600, "K": 45}
        point = space.complete(params, template)
        assert space.violated(point, template, shape) is None, point
        assert_variant_passes(kernel, template, shape, point)


@pytest.mark.parametrize("layout", [0, 1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("with_grad_attn", [False, True])
def test_backward_with_and_without_ctx(layout, with_grad_attn):
    """With ctx (one pass over ln) and without (the old call): both match the reference and
    repeat bitwise."""
    rng = np.random.default_rng(11)
    h, d, b, k = ((32, 128, 5, 60) if layout == 6 else (8, 128, 5, 70) if layout in (3, 4, 5)
                  else (5, 128, 9, 37))
    q, ln = rng.standard_normal((h, d), dtype=F32), rng.standard_normal((b, k, d), dtype=F32)
    gc = rng.standard_normal((b, h, d), dtype=F32)
    ga = rng.standard_normal((b, h, k), dtype=F32) if with_grad_attn else None
    pool = ph.PerHorizonAttentionPool(h, d, launch={"forward": {"LAYOUT": layout},
                                                    "backward": {"LAYOUT": layout, "TEAMS": 2,
                                                                 "GROUP_KEYS": 2}
                                                    if layout == 2 else {"LAYOUT": layout}})
    ctx, attn = pool.forward(q, ln)
    rq, rln = ref.pool_backward(q, ln, attn.get(), gc, grad_attn=ga)
    for given in (ctx, None):
        gq, gln = pool.backward(q, ln, attn, gc, given, grad_attn=ga)
        gq2, gln2 = pool.backward(q, ln, attn, gc, ctx=given, grad_attn=ga)
        assert pool.chosen["backward"]["params"]["LAYOUT"] == layout
        assert gq.get().tobytes() == gq2.get().tobytes()
        assert gln.get().tobytes() == gln2.get().tobytes()
        np.testing.assert_allclose(gq.get(), rq, rtol=1e-4, atol=1e-4 * np.abs(rq).max())
        np.testing.assert_allclose(gln.get(), rln, rtol=1e-4, atol=1e-4 * np.abs(rln).max())


# --- LAYOUT 3: wide heads, shared-memory tiles over key chunks ---

@pytest.mark.parametrize("template,shape", [
    ({"N_HORIZONS": 32, "HIDDEN_DIM": 128}, {"B": 3, "K": 64}),     # one chunk, KSPLIT 1
    ({"N_HORIZONS": 32, "HIDDEN_DIM": 128}, {"B": 2, "K": 100}),    # a partial last chunk
    ({"N_HORIZONS": 8, "HIDDEN_DIM": 512}, {"B": 2, "K": 33}),      # D split in slices
    ({"N_HORIZONS": 16, "HIDDEN_DIM": 256}, {"B": 3, "K": 1}),
    ({"N_HORIZONS": 4, "HIDDEN_DIM": 4}, {"B": 1, "K": 3000}),      # two keys a thread
    ({"N_HORIZONS": 4, "HIDDEN_DIM": 1024}, {"B": 2, "K": 9}),
    ({"N_HORIZONS": 8, "HIDDEN_DIM": 64}, {"B": 2, "K": 200})])
@pytest.mark.parametrize("params", [{}, {"CHUNK": 2048}, {"CHUNK": 8192}, {"BLOCK": 128},
                                    {"BLOCK": 512}],
                         ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "first")
@pytest.mark.parametrize("kernel", ["pool.forward", "pool.backward"])
def test_layout_3_matches_reference(template, shape, params, kernel):
    _assert_layout_passes(3, kernel, template, shape, params)


def _assert_layout_passes(layout: int, kernel: str, template: dict, shape: dict,
                          params: dict) -> None:
    """The first valid point of ``layout`` with ``params`` passes the variant checks (a skip
    where the layout has none at the template)."""
    space = ph.PerHorizonAttentionPool.SPACES[kernel.split(".")[1]]
    points = [p for p in space.points(template, shape) if p["LAYOUT"] == layout
              and all(p[k] == v for k, v in params.items())]
    if not points:
        pytest.skip(f"no LAYOUT {layout} point with {params} at {template}")
    assert_variant_passes(kernel, template, shape, points[0])


# --- LAYOUT 4: many horizons, a whole row in shared memory, tensor-core products ---

@pytest.mark.parametrize("template,shape", [
    ({"N_HORIZONS": 32, "HIDDEN_DIM": 128}, {"B": 3, "K": 64}),
    ({"N_HORIZONS": 32, "HIDDEN_DIM": 128}, {"B": 2, "K": 100}),    # keys past K in the tiles
    ({"N_HORIZONS": 16, "HIDDEN_DIM": 256}, {"B": 3, "K": 1}),
    ({"N_HORIZONS": 24, "HIDDEN_DIM": 128}, {"B": 3, "K": 33}),
    ({"N_HORIZONS": 8, "HIDDEN_DIM": 64}, {"B": 2, "K": 200})])
@pytest.mark.parametrize("params", [{"BLOCK": 128}, {"BLOCK": 256}, {"BLOCK": 128, "GRID": 1}],
                         ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
@pytest.mark.parametrize("kernel", ["pool.forward", "pool.backward"])
def test_layout_4_matches_reference(template, shape, params, kernel):
    _assert_layout_passes(4, kernel, template, shape, params)


# --- LAYOUT 5: wide rows through a ring of 16-key slots, tensor-core products ---

@pytest.mark.parametrize("template,shape", [
    ({"N_HORIZONS": 8, "HIDDEN_DIM": 512}, {"B": 3, "K": 128}),
    ({"N_HORIZONS": 8, "HIDDEN_DIM": 512}, {"B": 2, "K": 33}),      # a partial last slot
    ({"N_HORIZONS": 32, "HIDDEN_DIM": 128}, {"B": 5, "K": 64}),
    ({"N_HORIZONS": 16, "HIDDEN_DIM": 256}, {"B": 3, "K": 1}),
    ({"N_HORIZONS": 8, "HIDDEN_DIM": 1024}, {"B": 2, "K": 70}),
    ({"N_HORIZONS": 24, "HIDDEN_DIM": 128}, {"B": 7, "K": 200})])
@pytest.mark.parametrize("params", [{"BLOCK": 128, "STAGES": 2}, {"BLOCK": 256, "STAGES": 3},
                                    {"BLOCK": 512, "STAGES": 4}, {"BLOCK": 256, "GRID": 1}],
                         ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
@pytest.mark.parametrize("kernel", ["pool.forward", "pool.backward"])
def test_layout_5_matches_reference(template, shape, params, kernel):
    _assert_layout_passes(5, kernel, template, shape, params)


@pytest.mark.parametrize("k", [70, 9])
def test_layout_5_walks_rows_after_rows(k):
    """GRID 1: a block takes several rows one after another, the ring running on between them
    (the backward's G rows of two batch rows at once; without ctx each row's slots are visited
    twice); K=9 is one slot, fewer than STAGES - 1. Both passes match float64 and rerun bitwise."""
    rng = np.random.default_rng(k)
    h, d, b = 8, 128, 400
    q, ln = rng.standard_normal((h, d), dtype=F32), rng.standard_normal((b, k, d), dtype=F32)
    gc, ga = rng.standard_normal((b, h, d), dtype=F32), rng.standard_normal((b, h, k), dtype=F32)
    point = {"LAYOUT": 5, "BLOCK": 256, "STAGES": 4, "GRID": 1}
    pool = ph.PerHorizonAttentionPool(h, d, launch={"forward": point, "backward": point})
    ctx, attn = pool.forward(q, ln)
    assert pool.plan("forward", {"B": b, "K": k}, None).grid[0] < b  # rows after rows
    rctx, rattn = ref.pool_forward(q, ln)
    fctx, fattn = ref.pool_forward(q, ln, dtype=F32)
    for got, want, f32 in ((ctx, rctx, fctx), (attn, rattn, fattn)):
        tol = 8 * np.abs(f32 - want).max() + 1e-6 * np.abs(want).max()
        np.testing.assert_allclose(got.get(), want, rtol=0, atol=tol)
    rq, rln = ref.pool_backward(q, ln, attn.get(), gc, grad_attn=ga)
    for given in (ctx, None):
        gq, gln = pool.backward(q, ln, attn, gc, given, grad_attn=ga)
        assert pool.chosen["backward"]["params"]["LAYOUT"] == 5
        np.testing.assert_allclose(gq.get(), rq, rtol=1e-4, atol=1e-4 * np.abs(rq).max())
        np.testing.assert_allclose(gln.get(), rln, rtol=1e-4, atol=1e-4 * np.abs(rln).max())
        gq2, gln2 = pool.backward(q, ln, attn, gc, given, grad_attn=ga)
        assert gq2.get().tobytes() == gq.get().tobytes()
        assert gln2.get().tobytes() == gln.get().tobytes()


# --- LAYOUT 6: N_HORIZONS 32, HIDDEN_DIM 128, K <= 64 on Hopper's warpgroup MMA ---

@pytest.mark.parametrize("template,shape", [
    ({"N_HORIZONS": 32, "HIDDEN_DIM": 128}, {"B": 3, "K": 64}),
    ({"N_HORIZONS": 32, "HIDDEN_DIM": 128}, {"B": 2, "K": 50}),     # keys past K in the tile
    ({"N_HORIZONS": 32, "HIDDEN_DIM": 128}, {"B": 5, "K": 1}),
    ({"N_HORIZONS": 32, "HIDDEN_DIM": 128}, {"B": 700, "K": 33})])  # rows after rows
@pytest.mark.parametrize("params", [{"BLOCK": 128}, {"BLOCK": 256}],
                         ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
@pytest.mark.parametrize("kernel", ["pool.forward", "pool.backward"])
def test_layout_6_matches_reference(template, shape, params, kernel):
    _assert_layout_passes(6, kernel, template, shape, params)


def test_layout_6_is_refused_in_words_on_a_gpu_that_is_not_hopper(monkeypatch):
    """LAYOUT 6 is built for sm_90a; on another GPU the op says so before any compile."""
    from pycuda_heads.core import device
    monkeypatch.setattr(device, "compute_capability", lambda: (8, 0))
    pool = ph.PerHorizonAttentionPool(32, 128)
    point = pool.SPACES["forward"].complete({"LAYOUT": 6, "WGMMA": 1, "BLOCK": 256},
                                              {"N_HORIZONS": 32, "HIDDEN_DIM": 128})
    message = r"pool_forward is built with WGMMA=1, which needs an sm_90 GPU .* sm_80"
    with pytest.raises(ValueError, match=message):
        pool.kernel("forward", point)


def test_keys_beyond_the_range_raise_before_launch():
    pool = ph.PerHorizonAttentionPool(1, 4)
    with pytest.raises(ValueError, match="K must be at most 65536"):
        pool.forward(np.ones((1, 4), F32), np.ones((1, 65537, 4), F32))


@pytest.mark.parametrize("launch", [{}, {"forward": {"LAYOUT": 0}, "backward": {"LAYOUT": 0}},
                                    {"forward": {"LAYOUT": 1}, "backward": {"LAYOUT": 1}}],
                         ids=["default", "layout0", "layout1"])
@pytest.mark.parametrize("b,k", [(3, 8), (300, 64)])
def test_programmatic_dependent_launches_give_the_bits_of_plain_launches(monkeypatch, launch,
                                                                         b, k):
    """A chain where every launch reads what the one before it wrote (each forward's ln is the
    last backward's grad_ln; each backward reads that forward's attn and ctx) gives, launched
    with programmatic dependent launch, the bits of the same chain launched plainly."""
    import pycuda.gpuarray as gpuarray
    h, d = 5, 128
    rng = np.random.default_rng(11)
    q_h, ln0, grad_ctx = (gpuarray.to_gpu(rng.standard_normal(s, dtype=F32))
                          for s in ((h, d), (b, k, d), (b, h, d)))

    def chain():
        pool, ln, outs = ph.PerHorizonAttentionPool(h, d, launch=launch), ln0, []
        for _ in range(10):
            ctx, attn = pool.forward(q_h, ln)
            grad_q_h, ln = pool.backward(q_h, ln, attn, grad_ctx, ctx=ctx)
            outs += [ctx, attn, grad_q_h]
        return pool, [*outs, ln]

    assert_pdl_gives_plain_bits(monkeypatch, chain)


# --- split-K: long rows in a small batch run as virtual rows, joined by pool_split.cuh ---

_LAYOUTS = {f"layout{n}": {"forward": {"LAYOUT": n}, "backward": {"LAYOUT": n}} for n in (0, 1)}


# Launches are checked at the whole row's K, so LAYOUT 0 (its scores in shared memory) runs
# no K=65536.
@pytest.mark.parametrize("launch,h,d,b,k", [
    pytest.param(_LAYOUTS.get(name, {}), *shape, id=f"{name}-{shape[3]}")
    for name in ("default", "layout0", "layout1")
    for shape in ((5, 128, 2, 4096), (3, 96, 1, 6000), (1, 30, 1, 65536))
    if not (name == "layout0" and shape[3] > 8192)] + [
    # LAYOUT 4 holds the whole row's 512 keys (the launch is checked there), and runs 2 of 256
    pytest.param({"forward": {"LAYOUT": 4}, "backward": {"LAYOUT": 4}}, 8, 64, 2, 512,
                 id="layout4-512"),
    # LAYOUT 5 streams any K: 16 rows of 256 keys a batch row
    pytest.param({"forward": {"LAYOUT": 5}, "backward": {"LAYOUT": 5}}, 8, 512, 2, 4096,
                 id="layout5-4096")])
@pytest.mark.parametrize("peaked", [False, True])
def test_split_rows_match_the_reference_with_and_without_grad_attn(launch, h, d, b, k, peaked):
    """Split rows (16 of 256 keys, 16 of 375, 256 of 256) against float64, with grad_attn's
    row sums (pool_attn_dot) too; with peaked scores one split holds nearly all of a row's
    weight. Reruns are bitwise; without ctx the backward runs unsplit and
    agrees."""
    from pycuda_heads.ops.pool import split_count
    assert split_count(b, k) > 1
    rng = np.random.default_rng(k)
    q = rng.standard_normal((h, d), dtype=F32) * F32(8 if peaked else 1)
    ln = rng.standard_normal((b, k, d), dtype=F32)
    gc, ga = rng.standard_normal((b, h, d), dtype=F32), rng.standard_normal((b, h, k), dtype=F32)
    pool = ph.PerHorizonAttentionPool(h, d, launch=launch)
    ctx, attn = pool.forward(q, ln)
    rctx, rattn = ref.pool_forward(q, ln)
    fctx, fattn = ref.pool_forward(q, ln, dtype=F32)
    for got, want, f32 in ((ctx, rctx, fctx), (attn, rattn, fattn)):
        tol = 8 * np.abs(f32 - want).max() + 1e-6 * np.abs(want).max()
        np.testing.assert_allclose(got.get(), want, rtol=0, atol=tol)
    again = pool.forward(q, ln)
    assert again[0].get().tobytes() == ctx.get().tobytes()
    assert again[1].get().tobytes() == attn.get().tobytes()
    for grad_attn in (None, ga):
        rq, rln = ref.pool_backward(q, ln, attn.get(), gc, grad_attn=grad_attn)
        gq, gln = pool.backward(q, ln, attn, gc, ctx, grad_attn=grad_attn)
        np.testing.assert_allclose(gq.get(), rq, rtol=1e-4, atol=1e-4 * np.abs(rq).max())
        np.testing.assert_allclose(gln.get(), rln, rtol=1e-4, atol=1e-4 * np.abs(rln).max())
        gq2, gln2 = pool.backward(q, ln, attn, gc, ctx, grad_attn=grad_attn)
        assert gq2.get().tobytes() == gq.get().tobytes()
        assert gln2.get().tobytes() == gln.get().tobytes()
        uq, uln = pool.backward(q, ln, attn, gc, grad_attn=grad_attn)  # no ctx: unsplit
        np.testing.assert_allclose(uq.get(), rq, rtol=1e-4, atol=1e-4 * np.abs(rq).max())
        np.testing.assert_allclose(uln.get(), rln, rtol=1e-4, atol=1e-4 * np.abs(rln).max())


def test_split_rows_write_every_output_under_poison():
    """Inside poisoned_outputs every buffer (the virtual rows' too) starts as NaN: a split
    output left unwritten would show."""
    from pycuda_heads.core.arrays import poisoned_outputs
    rng = np.random.default_rng(3)
    q, ln = rng.standard_normal((5, 128), dtype=F32), rng.standard_normal((2, 4096, 128), dtype=F32)
    gc = rng.standard_normal((2, 5, 128), dtype=F32)
    ga = rng.standard_normal((2, 5, 4096), dtype=F32)
    pool = ph.PerHorizonAttentionPool(5, 128)
    with poisoned_outputs():
        ctx, attn = pool.forward(q, ln)
        outs = [ctx, attn, *pool.backward(q, ln, attn, gc, ctx, grad_attn=ga)]
    assert all(np.isfinite(o.get()).all() for o in outs)
