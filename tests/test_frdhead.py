"""GPU: the FRD head (forward, F.3b, F.3c, and the backward role that runs both; FrdHead and the
small-batch FrdHeadSmall) beyond test_kernels.py: its parity test, ReLU-mask, dead-unit and
sentinel oracles and the references for other tile heights and engines, the whole training
step."""
import numpy as np
import pytest

import pycuda_heads as ph
from pycuda_heads import reference as ref
from pycuda_heads.core.arrays import poisoned_outputs
from gpu_helpers import assert_variant_passes, oracles

pytestmark = pytest.mark.gpu
KERNELS = ("frdhead.forward", "frdhead.grad_w2", "frdhead.grad_w1")
# Every tile height (at D_in = F = 128 only grad_w2 has shared memory for BM=64), one tile to
# many per block.
ROWS = [{"BM": 16, "CHUNK": 64}, {"BM": 32, "CHUNK": 256}, {"BM": 32, "CHUNK": 2048}]
# The small-batch head (frdsmall): one warp a block to 32, one row a block to 16, each weight's
# batch sum in one warp to split over 32.
SMALL = [{"WARPS": 4, "ROWS": 1, "SPLIT": 1}, {"WARPS": 8, "ROWS": 2, "SPLIT": 4},
         {"WARPS": 32, "ROWS": 16, "SPLIT": 32}]
VARIANTS = ([(k, p) for k in KERNELS for p in ROWS]
            + [("frdhead.grad_w2", {"BM": 64, "CHUNK": 512})]
            + [(k.replace("frdhead", "frdsmall"), p) for k in KERNELS for p in SMALL])
# The forward fused with the loss, of either head.
LOSS_VARIANTS = ([("frdhead.forward_loss", p) for p in ROWS]
                 + [("frdsmall.forward_loss", p) for p in SMALL])
# The forward roles on Hopper's warpgroup MMA (the model's head shape only): both warpgroup
# counts, chunk sizes and row-buffer layouts, in 3xTF32 (WGMMA 1) and on FP16 pieces in one
# launch (WGMMA 2).
WGMMA = [{"WGMMA": 1, "WG": 2, "CS": 16, "SWZ": 1}, {"WGMMA": 1, "WG": 1, "CS": 4, "SWZ": 0},
         {"WGMMA": 2, "WG": 2, "CS": 16, "SWZ": 1}, {"WGMMA": 2, "WG": 1, "CS": 16, "SWZ": 0},
         {"WGMMA": 2, "WG": 2, "CS": 16, "SWZ": 0}]
SUITE_HEAD = {"D_IN": 128, "FRD_HIDDEN": 128, "N_HORIZONS": 5, "N_ATOMS": 21}
# The backward stages on it: both warpgroup counts and every chunk size of the row products,
# batch steps of 16 and 32 rows, one or two weight-gradient blocks a multiprocessor and rings of
# two to four steps (B = 1 and 63: a slice shorter than the ring). BK 64 no longer fits: a step's
# X halves are double-buffered; nor do grad_w1's deeper rings at BK 32 or two blocks an SM, since
# its steps also copy the mask's tile.
WGMMA_BWD = ([("frdhead.grad_w2", {"WGMMA": 1, "WG": 2, "CS": 4, "BK": 32, "OCC": 1,
                                   "STAGES": 3}),
              ("frdhead.grad_w2", {"WGMMA": 1, "WG": 1, "CS": 8, "BK": 32, "OCC": 1}),
              ("frdhead.grad_w2", {"WGMMA": 1, "WG": 2, "CS": 8, "BK": 16, "OCC": 2, "STAGES": 4})]
             + [("frdhead.grad_w1", {"WGMMA": 1, "WG": wg, "CS": cs, "BK": bk, "OCC": occ,
                                     "STAGES": st})
                for wg, cs, bk, occ, st in ((1, 2, 16, 2, 2), (1, 4, 32, 1, 2), (2, 4, 16, 2, 2),
                                            (2, 2, 16, 1, 4), (2, 4, 32, 1, 3), (1, 8, 16, 2, 3))])
# Both stages as one role: the FP16 row products (WGMMA 2) at both warpgroup counts beside
# weight gradients of either batch step and ring depth (two blocks an SM with a ring of 4: only
# grad_w1's unmasked weight gradient fits it), the 3xTF32 stages (WGMMA 1) and mma.sync
# (WGMMA 0).
BACKWARD = [{"WGMMA": 2, "WG": 2, "BK": 32, "OCC": 1, "STAGES": 3},
            {"WGMMA": 2, "WG": 1, "BK": 16, "OCC": 2, "STAGES": 2},
            {"WGMMA": 2, "WG": 2, "BK": 16, "OCC": 2, "STAGES": 4},
            {"WGMMA": 1, "WG": 2, "CS": 4, "BK": 32, "OCC": 1, "STAGES": 3}, {"WGMMA": 0}]


def _hopper():
    from pycuda_heads.core import device
    if device.compute_capability() != (9, 0):
        pytest.skip("WGMMA=1 needs an sm_90 GPU")


def _fwd_id(p):
    return f"WGMMA{p['WGMMA']}-WG{p['WG']}-CS{p['CS']}-SWZ{p['SWZ']}"


def _id(kernel_params):
    kernel, params = kernel_params
    return kernel.replace(".", "-") + "-" + "-".join(f"{k}{v}" for k, v in params.items())


@pytest.mark.parametrize("variant", VARIANTS, ids=_id)
@pytest.mark.parametrize("check", ["parity_numgrad", "relu_mask", "sentinel_rows"])
def test_oracles(variant, check):
    kernel, params = variant
    result = oracles(kernel, params=params)[check]
    assert result["passed"], result


@pytest.mark.parametrize("variant", LOSS_VARIANTS, ids=_id)
@pytest.mark.parametrize("check", ["loss_numgrad", "sentinel_rows"])
def test_loss_oracles(variant, check):
    kernel, params = variant
    result = oracles(kernel, params=params)[check]
    assert result["passed"], result


@pytest.mark.parametrize("params", WGMMA, ids=_fwd_id)
@pytest.mark.parametrize("check", ["parity_numgrad", "relu_mask", "sentinel_rows"])
def test_wgmma_forward_oracles(params, check):
    _hopper()
    result = oracles("frdhead.forward", params=params)[check]
    assert result["passed"], result


@pytest.mark.parametrize("params", WGMMA, ids=_fwd_id)
@pytest.mark.parametrize("check", ["loss_numgrad", "sentinel_rows"])
def test_wgmma_loss_oracles(params, check):
    _hopper()
    result = oracles("frdhead.forward_loss", params=params)[check]
    assert result["passed"], result


@pytest.mark.parametrize("b", [1, 63, 333, 4097])
@pytest.mark.parametrize("kernel", ["frdhead.forward", "frdhead.forward_loss"])
@pytest.mark.parametrize("params", WGMMA, ids=_fwd_id)
def test_wgmma_matches_reference(params, kernel, b):
    """float64 reference, every output written (poisoned), bitwise reruns; from one tile short
    of its 64 rows to more tiles than warpgroups (the grid-stride loop's second pass)."""
    _hopper()
    assert_variant_passes(kernel, SUITE_HEAD, {"B": b}, params)


@pytest.mark.parametrize("variant", WGMMA_BWD, ids=_id)
@pytest.mark.parametrize("check", ["parity_numgrad", "relu_mask", "sentinel_rows"])
def test_wgmma_backward_oracles(variant, check):
    _hopper()
    kernel, params = variant
    result = oracles(kernel, params=params)[check]
    assert result["passed"], result


@pytest.mark.parametrize("b", [1, 63, 333, 4097, 20000])
@pytest.mark.parametrize("variant", WGMMA_BWD, ids=_id)
def test_wgmma_backward_matches_reference(variant, b):
    """float64 reference, every output written (poisoned), bitwise reruns; from one row to more
    batch steps than blocks (B = 20000: several steps a block, a short last slice)."""
    _hopper()
    kernel, params = variant
    assert_variant_passes(kernel, SUITE_HEAD, {"B": b}, params)


def _bwd_id(p):
    return "-".join(f"{k}{v}" for k, v in p.items())


@pytest.mark.parametrize("params", BACKWARD, ids=_bwd_id)
@pytest.mark.parametrize("check", ["parity_numgrad", "dead_unit", "sentinel_rows"])
def test_backward_oracles(params, check):
    _hopper()
    result = oracles("frdhead.backward", params=params)[check]
    assert result["passed"], result


@pytest.mark.parametrize("b", [1, 63, 333, 4097, 20000])
@pytest.mark.parametrize("params", BACKWARD, ids=_bwd_id)
def test_backward_matches_reference(params, b):
    """float64 reference, every output written (poisoned), bitwise reruns; from one row to more
    64-row tiles than warpgroups and more batch steps than weight-gradient blocks."""
    _hopper()
    assert_variant_passes("frdhead.backward", SUITE_HEAD, {"B": b}, params)


def test_f16_backward_keeps_float32_accuracy_on_wide_rows():
    """WGMMA 2 scales each row of G, w2, dpre and w1 by one power of two, and folds w2's and
    w1's row scales into G's and dpre's columns: values 2^12 apart along a row and down a
    weight's column stay within the float64 rule."""
    _hopper()
    from pycuda_heads.catalog import catalog
    from pycuda_heads.verify.checks import compare
    spec = catalog()["frdhead.backward"]
    x = spec.make_inputs(SUITE_HEAD, {"B": 777}, seed=3)
    x["grad_logits"][:, :, ::4] *= np.float32(2 ** 12)
    x["w2"][:, ::3, :] *= np.float32(2 ** -12)
    x["w1"][::5] *= np.float32(2 ** 12)
    head = ph.FrdHead(128, 128, 5, 21, launch={"backward": {"WGMMA": 2}})
    got = [g.get() for g in head.backward(*(x[n] for n in spec.reads))]
    want64, want32 = spec.run_reference(x), spec.run_reference(x, np.float32)
    for name, g, w64, w32 in zip(spec.writes, got, want64, want32):
        result = compare(g, w64, w32)
        assert result["passed"], (name, result)


def test_wgmma_backward_refuses_misaligned_rows():
    _hopper()
    import pycuda.gpuarray as ga
    head = ph.FrdHead(128, 128, 5, 21, launch={"grad_w2": {"WGMMA": 1}})
    rng = np.random.default_rng(4)
    flat = ga.to_gpu(rng.standard_normal(8 * 105 + 1, dtype=np.float32))
    grad_logits = flat[1:].reshape(8, 5, 21)  # 4 bytes past an aligned start
    hidden = ga.to_gpu(rng.standard_normal((8, 128), dtype=np.float32))
    w2 = ga.to_gpu(rng.standard_normal((5, 21, 128), dtype=np.float32))
    with pytest.raises(ValueError, match="grad_logits: device pointer .* not 16-byte aligned"):
        head.grad_w2(hidden, w2, grad_logits)


@pytest.mark.parametrize("engine", [1, 2])
def test_wgmma_refuses_what_it_cannot_run(engine):
    _hopper()
    with pytest.raises(ValueError, match="WGMMA == 0 or"):
        ph.FrdHead(37, 50, 5, 21, launch={"forward": {"WGMMA": engine}})
    import pycuda.gpuarray as ga
    head = ph.FrdHead(128, 128, 5, 21, launch={"forward": {"WGMMA": engine}})
    rng = np.random.default_rng(3)
    flat = ga.to_gpu(rng.standard_normal(8 * 128 + 1, dtype=np.float32))
    h_t = flat[1:].reshape(8, 128)  # 4 bytes past an aligned start
    w1 = ga.to_gpu(rng.standard_normal((128, 128), dtype=np.float32))
    w2 = ga.to_gpu(rng.standard_normal((5, 21, 128), dtype=np.float32))
    b1, b2 = ga.zeros(128, np.float32), ga.zeros((5, 21), np.float32)
    with pytest.raises(ValueError, match="h_t: device pointer .* not 16-byte aligned"):
        head.forward(h_t, w1, b1, w2, b2)


@pytest.mark.parametrize("kernel", ["frdhead.forward", "frdhead.forward_loss"])
def test_f16_forward_keeps_float32_accuracy_on_wide_rows(kernel):
    """WGMMA 2 scales each row of h_t, w1, hidden and w2 by one power of two: values 2^12 apart
    along a row still meet the float64 rule, and a zero row and a row of one tiny value (whose
    scales are 1 and the clamped largest) come out finite, which the rule also checks."""
    _hopper()
    import pycuda.gpuarray as ga
    from pycuda_heads.verify.checks import compare
    rng = np.random.default_rng(11)
    b = 333
    h_t = rng.standard_normal((b, 128)) * np.exp2(rng.integers(-12, 13, (1, 128)))
    h_t[5] = 0.0
    h_t[6] = 0.0
    h_t[6, 17] = 3e-30
    w1 = rng.standard_normal((128, 128)) / np.sqrt(128) * np.exp2(rng.integers(-6, 7, (1, 128)))
    w2 = rng.standard_normal((5, 21, 128)) * np.exp2(rng.integers(-6, 7, (1, 1, 128))) / 64
    b1, b2 = rng.standard_normal(128) * 0.1, rng.standard_normal((5, 21))
    x = [a.astype(np.float32) for a in (h_t, w1, b1, w2, b2)]
    labels = rng.integers(-1, 21, (b, 5)).astype(np.int32)
    head = ph.FrdHead(128, 128, 5, 21, launch={kernel.split(".")[1]: {"WGMMA": 2}})
    args = [ga.to_gpu(a) for a in x]
    r64 = ref.frdhead_forward(*x)
    r32 = ref.frdhead_forward(*x, dtype=np.float32)
    if kernel == "frdhead.forward":
        got = [o.get() for o in head.forward(*args)]
    else:
        got = [o.get() for o in head.forward_loss(*args, ga.to_gpu(labels))][:2]
    for name, out, want, want32 in zip(("hidden", "logits"), got, r64, r32):
        result = compare(out, want, want32)
        assert result["passed"], (name, result)


def test_wgmma_is_refused_in_words_on_a_gpu_that_is_not_hopper(monkeypatch):
    """The backward's WGMMA entries build for sm_90a; another GPU is told so before any compile."""
    from pycuda_heads.core import device
    monkeypatch.setattr(device, "compute_capability", lambda: (8, 0))
    head = ph.FrdHead(128, 128, 5, 21)
    point = head.SPACES["grad_w1"].complete({"WGMMA": 1}, head.template)
    message = r"frdhead_wg_grad_w1 is built with WGMMA=1, which needs an sm_90 GPU .* sm_80"
    with pytest.raises(ValueError, match=message):
        head.kernel("grad_w1", point)


@pytest.mark.parametrize("variant", VARIANTS + LOSS_VARIANTS, ids=_id)
def test_variants_match_reference_at_odd_sizes(variant):
    kernel, params = variant
    template = {"D_IN": 37, "FRD_HIDDEN": 50, "N_HORIZONS": 5, "N_ATOMS": 21}
    assert_variant_passes(kernel, template, {"B": 1100}, params)


def test_full_step_matches_float64_and_reruns_bitwise():
    """forward -> FrdSoftmaxCE -> backward on every output, poisoned, twice."""
    rng = np.random.default_rng(7)
    b, d, f, h, a = 777, 128, 128, 5, 21
    x = {"h_t": rng.standard_normal((b, d), dtype=np.float32),
         "w1": (rng.standard_normal((f, d)) / np.sqrt(d)).astype(np.float32),
         "b1": rng.standard_normal(f, dtype=np.float32) * np.float32(0.1),
         "w2": (rng.standard_normal((h, a, f)) / np.sqrt(f)).astype(np.float32),
         "b2": rng.standard_normal((h, a), dtype=np.float32)}
    labels = rng.integers(-1, a, size=(b, h)).astype(np.int32)
    labels[-3:] = -1
    head, frd = ph.FrdHead(d, f, h, a), ph.FrdSoftmaxCE(h, a)

    def step():
        with poisoned_outputs():
            hidden, logits = head.forward(*x.values())
            grad_logits, ce = frd.softmax_ce_grad(logits, labels)
            grads = head.backward(x["h_t"], x["w1"], x["w2"], hidden, grad_logits)
        return [g.get() for g in (logits, ce, *grads)]

    first, second = step(), step()
    assert all(p.tobytes() == q.tobytes() for p, q in zip(first, second))
    hidden, logits = ref.frdhead_forward(*x.values())
    grad_logits, ce = ref.frd_softmax_ce_grad(logits, labels)
    gw2, gb2, dhidden = ref.frdhead_grad_w2(hidden, x["w2"], grad_logits)
    gw1, gb1, gh = ref.frdhead_grad_w1(x["h_t"], x["w1"], hidden, dhidden)
    want = [logits, ce, gw1, gb1, gw2, gb2, gh]
    for got, w in zip(first, want):
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, w, rtol=2e-4, atol=2e-5 * np.abs(w).max())


def test_shapes_are_checked_before_launch():
    head = ph.FrdHead(16, 8, 2, 3)
    h_t = np.ones((4, 16), np.float32)
    w1, b1 = np.ones((8, 16), np.float32), np.ones(8, np.float32)
    with pytest.raises(ValueError, match=r"w2: expected shape \(H, A, F\) = \(2, 3, 8\)"):
        head.forward(h_t, w1, b1, np.ones((6, 8), np.float32)[None], np.ones((2, 3), np.float32))
