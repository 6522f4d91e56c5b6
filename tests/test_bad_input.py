"""Bad input to every op (pool, residual, gate, frd, reduce): each case raises a clear error
naming the argument, launches nothing and leaves the CUDA context usable. NaN and inf inputs are
not errors: they come out as non-finite outputs. Constructor cases need no GPU."""
import numpy as np
import pytest

import pycuda_heads as ph
from pycuda_heads.ops.reduce import ReduceAxis0

H, D, A = 5, 128, 21
RNG = np.random.default_rng(14)


def f32(*shape):
    return RNG.standard_normal(shape, dtype=np.float32)


def to_gpu(x):
    import pycuda.gpuarray as gpuarray
    return gpuarray.to_gpu(np.ascontiguousarray(x))


def misaligned(*shape):
    """A float32 GPUArray whose pointer is 4 bytes past a 16-byte boundary."""
    import pycuda.gpuarray as gpuarray
    n = int(np.prod(shape))
    base = to_gpu(f32(n + 1))
    return gpuarray.GPUArray(shape, np.float32, gpudata=int(base.gpudata) + 4, base=base)


class Strided:
    """A CUDA array (``__cuda_array_interface__``) that is a transposed, non-contiguous view."""

    def __init__(self, shape):
        self.base = to_gpu(f32(*reversed(shape)))
        strides = tuple(4 * int(np.prod(shape[:i])) for i in range(len(shape)))
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": "<f4", "strides": strides,
            "data": (int(self.base.gpudata), False), "version": 3}


class Huge:
    """A CUDA array claiming more elements than the kernels can index (never dereferenced)."""

    def __init__(self, shape, typestr="<f4"):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "strides": None,
                                         "data": (256, False), "version": 3}


def pool(**kw):
    return ph.PerHorizonAttentionPool(H, D, **kw)


def residual(**kw):
    return ph.PerHorizonResidual(H, D, **kw)


def gate(**kw):
    return ph.AlphaGate(H, **kw)


def frd(**kw):
    return ph.FrdSoftmaxCE(H, A, **kw)


FRD_STAGED = {"softmax_ce_grad": {"LAYOUT": 1, "TPR": 4, "BLOCK": 128, "STAGE": 1, "CPW": 1}}

# (id, call, exception, what the message must say)
def _wide_head() -> tuple:
    """h_t, w1, b1, w2, b2 of a head with D_in = 4096, F = 128 at B = 2."""
    return f32(2, 4096), f32(128, 4096), f32(128), f32(H, A, 128), f32(H, A)


CALLS = [
    ("pool-dtype", lambda: pool().forward(f32(H, D), f32(2, 8, D).astype(np.float64)),
     TypeError, r"ln: expected dtype float32, got float64"),
    ("pool-rank", lambda: pool().forward(f32(H, D), f32(8, D)), ValueError,
     r"ln: expected a 3-d array \(B, K, D\)"),
    ("pool-horizons", lambda: pool().forward(f32(H - 1, D), f32(2, 8, D)), ValueError,
     r"q_h: expected shape \(H, D\)"),
    ("pool-hidden", lambda: pool().forward(f32(H, D), f32(2, 8, D // 2)), ValueError,
     r"ln: expected shape"),
    ("pool-strided-numpy", lambda: pool().forward(f32(H, D), f32(2, 16, D)[:, ::2]), ValueError,
     r"ln: expected a C-contiguous array"),
    ("pool-zero-K", lambda: pool().forward(f32(H, D), f32(2, 0, D)), ValueError,
     r"ln: axis 1 \(K\) must be >= 1"),
    ("pool-zero-B", lambda: pool().forward(f32(H, D), f32(0, 8, D)), ValueError,
     r"ln: axis 0 \(B\) must be >= 1"),
    ("pool-misaligned", lambda: pool(launch={"forward": {"VEC": 4}}).forward(
        f32(H, D), misaligned(2, 8, D)), ValueError, r"ln: device pointer .* 16-byte aligned"),
    ("pool-backward-attn", lambda: pool().backward(f32(H, D), f32(2, 8, D), f32(2, H, 9),
                                                   f32(2, H, D)), ValueError,
     r"attn: expected shape"),
    ("pool-backward-list", lambda: pool().backward(f32(H, D), f32(2, 8, D), f32(2, H, 8),
                                                   [[0.0]]), TypeError,
     r"grad_ctx: expected a NumPy array, a PyCUDA GPUArray"),
    ("pool-backward-grad-attn-dtype", lambda: pool().backward(
        f32(H, D), f32(2, 8, D), f32(2, H, 8), f32(2, H, D),
        grad_attn=f32(2, H, 8).astype(np.float16)), TypeError, r"grad_attn: expected dtype"),
    ("residual-bias", lambda: residual().forward(f32(2, H, D), f32(H, D), f32(H - 1)),
     ValueError, r"bias_res: expected shape"),
    ("residual-int-weights", lambda: residual().forward(
        f32(2, H, D), np.ones((H, D), np.int32), f32(H)), TypeError, r"w_res: expected dtype"),
    ("residual-strided-cuda", lambda: residual().forward(Strided((2, H, D)), f32(H, D), f32(H)),
     ValueError, r"ctx: expected a C-contiguous array"),
    ("residual-out-numpy", lambda: residual().backward(f32(2, H, D), f32(H, D), f32(2, H),
                                                       out=f32(2, H, D)), TypeError,
     r"out: expected a device array"),
    ("residual-accumulate", lambda: residual().backward(f32(2, H, D), f32(H, D), f32(2, H),
                                                        accumulate=True), ValueError,
     r"accumulate=True needs out="),
    ("residual-misaligned-out", lambda: residual(launch={"backward": {"VEC": 4}}).backward(
        f32(2, H, D), f32(H, D), f32(2, H), out=misaligned(2, H, D)), ValueError,
     r"out: device pointer"),
    ("gate-alpha-rank", lambda: gate().forward(f32(4, H), f32(4, H), f32(H, 1)), ValueError,
     r"alpha: expected a 1-d array"),
    ("gate-batch-mismatch", lambda: gate().forward(f32(4, H), f32(3, H), f32(H)), ValueError,
     r"residual: expected shape .*\(B is 4"),
    ("gate-backward-dtype", lambda: gate().backward(f32(4, H), f32(H),
                                                    f32(4, H).astype(np.float64)),
     TypeError, r"grad_out: expected dtype float32"),
    ("gate-zero-B", lambda: gate().forward(f32(0, H), f32(0, H), f32(H)), ValueError,
     r"head: axis 0 \(B\) must be >= 1"),
    ("frd-int64-labels", lambda: frd().softmax_ce_grad(f32(2, H, A),
                                                       np.zeros((2, H), np.int64)),
     TypeError, r"labels: expected dtype int32, got int64"),
    ("frd-int64-device-labels", lambda: frd().softmax_ce_grad(
        f32(2, H, A), to_gpu(np.zeros((2, H), np.int64))), TypeError,
     r"labels: expected dtype int32, got int64"),
    ("frd-label-too-big", lambda: frd().softmax_ce_grad(f32(2, H, A),
                                                        np.full((2, H), A, np.int32)),
     ValueError, r"labels\[0, 0\] = 21 is outside \[-1, 21\)"),
    # a head too wide for every launch configuration of FrdHead's kernels (shared memory)
    ("frd-head-too-wide", lambda: ph.FrdHead(4096, 128, H).forward(*_wide_head()), ValueError,
     r"FrdHead\.forward: shape \{'B': 2\} cannot run with .* restriction "
     r"'SHARED_BYTES <= MAX_SHARED_BYTES' fails \(needs \d+ B shared memory"),
    ("frd-head-loss-too-wide", lambda: ph.FrdHead(4096, 128, H).forward_loss(
        *_wide_head(), np.zeros((2, H), np.int32)), ValueError,
     r"FrdHead\.forward_loss: shape \{'B': 2\} cannot run with .* restriction "
     r"'SHARED_BYTES <= MAX_SHARED_BYTES' fails"),
    ("frd-atoms", lambda: frd().softmax_ce_grad(f32(2, H, A - 1), np.zeros((2, H), np.int32)),
     ValueError, r"logits: expected shape"),
    ("frd-labels-batch", lambda: frd().softmax_ce_grad(f32(2, H, A), np.zeros((3, H), np.int32)),
     ValueError, r"labels: expected shape"),
    ("frd-misaligned-staged", lambda: frd(launch=FRD_STAGED).softmax_ce_grad(
        misaligned(2, H, A), np.zeros((2, H), np.int32)), ValueError,
     r"logits: device pointer"),
    ("frd-atoms-out-of-range", lambda: ph.FrdSoftmaxCE(H, 5000).softmax_ce_grad(
        f32(2, H, 5000), np.zeros((2, H), np.int32)), ValueError,
     r"FrdSoftmaxCE.softmax_ce_grad: shape .* cannot run"),
    ("reduce-rank", lambda: ReduceAxis0().axis0(f32(7)), ValueError,
     r"x: expected a 2-d array \(N, M\)"),
    ("reduce-dtype", lambda: ReduceAxis0().axis0(np.ones((7, 3), np.int32)), TypeError,
     r"x: expected dtype float32"),
    ("reduce-beyond-grid", lambda: ReduceAxis0(launch={"axis0": {"SPLIT_ROWS": 64}}).axis0(
        np.ones((65535 * 64 + 1, 1), np.float32)), ValueError,
     r"ReduceAxis0.axis0: shape .* cannot run .* SPLIT_ROWS"),
    ("gate-too-many-elements", lambda: gate().forward(Huge((2**31 // H + 1, H)),
                                                      Huge((2**31 // H + 1, H)), f32(H)),
     ValueError, r"head: shape .* more than 2147483647 elements"),
]

# Constructor arguments: checked before the GPU is touched.
CONSTRUCT = [
    ("zero-hidden", lambda: ph.PerHorizonAttentionPool(H, 0), ValueError,
     r"hidden_dim must be a positive int, got 0"),
    ("bool-horizons", lambda: ph.AlphaGate(True), ValueError, r"n_horizons must be a positive"),
    ("float-atoms", lambda: ph.FrdSoftmaxCE(H, 2.5), ValueError, r"n_atoms must be a positive"),
    ("wide-small-head", lambda: ph.FrdHeadSmall(2048, 128, H), ValueError,
     r"d_in must be at most 1024, got 2048"),
    ("zero-small-head", lambda: ph.FrdHeadSmall(128, 0, H), ValueError,
     r"hidden must be a positive int, got 0"),
    ("negative-horizons", lambda: ph.PerHorizonResidual(-1, D), ValueError,
     r"n_horizons must be a positive int, got -1"),
    ("unknown-role", lambda: pool(launch={"fwd": {"BLOCK": 128}}), ValueError,
     r"launch= has unknown kernels \['fwd'\]"),
    ("unknown-knob", lambda: gate(launch={"forward": {"WARPS": 2}}), ValueError,
     r"unknown launch parameter 'WARPS'"),
    ("bad-value", lambda: gate(launch={"forward": {"BLOCK": 100}}), ValueError,
     r"BLOCK=100 is not one of"),
    ("not-a-dict", lambda: residual(launch={"forward": 256}), TypeError,
     r"launch\['forward'\] must be a dict"),
    ("not-a-mapping", lambda: frd(launch=[("softmax_ce_grad", {})]), TypeError,
     r"launch= must map kernel roles"),
    ("restriction", lambda: ph.PerHorizonAttentionPool(H, 30, launch={"forward": {"VEC": 4}}),
     ValueError, r"breaks the restriction 'HIDDEN_DIM % VEC == 0'"),
]


@pytest.fixture
def launches():
    """Every kernel launched inside the test (an error must come before the first)."""
    from pycuda_heads.core.compile import recorded_launches
    with recorded_launches() as made:
        yield made


def context_usable():
    head, res, alpha = f32(6, H), f32(6, H), f32(H)
    out = ph.AlphaGate(H).forward(head, res, alpha).get()
    np.testing.assert_allclose(out, head + np.tanh(alpha) * res, rtol=1e-5, atol=1e-6)
    from pycuda_heads.core.device import cuda
    cuda().Context.synchronize()


def test_there_are_enough_cases():
    families = {case[0].split("-")[0] for case in CALLS}
    assert len(CALLS) + len(CONSTRUCT) >= 30 and families == {"pool", "residual", "gate",
                                                              "frd", "reduce"}


@pytest.mark.parametrize("make,error,message", [c[1:] for c in CONSTRUCT],
                         ids=[c[0] for c in CONSTRUCT])
def test_bad_constructor_arguments_raise_before_the_gpu(make, error, message, monkeypatch):
    from pycuda_heads.core import device
    monkeypatch.setattr(device, "cuda", lambda: pytest.fail("the GPU was touched"))
    with pytest.raises(error, match=message):
        make()


@pytest.mark.gpu
@pytest.mark.parametrize("call,error,message", [c[1:] for c in CALLS], ids=[c[0] for c in CALLS])
def test_bad_input_raises_clearly_and_launches_nothing(call, error, message, launches):
    with pytest.raises(error, match=message):
        call()
    assert [launch[0].name for launch in launches] == []
    context_usable()


@pytest.mark.gpu
def test_a_large_batch_within_the_limits_works():
    """B beyond one grid dimension's 65535 on the default launch: the reduce splits deeper."""
    x = np.ones((65535 * 64 + 1, 3), np.float32)
    assert (ReduceAxis0().axis0(x).get() == x.shape[0]).all()
    context_usable()


NON_FINITE = [  # each returns its outputs
    ("pool", lambda x: pool().forward(f32(H, D), x), (2, 8, D)),
    ("residual", lambda x: [residual().forward(x, f32(H, D), f32(H))], (2, H, D)),
    ("gate", lambda x: [gate().forward(f32(2, H), x, f32(H))], (2, H)),
    ("frd", lambda x: frd().softmax_ce_grad(x, np.zeros((2, H), np.int32)), (2, H, A)),
    ("reduce", lambda x: [ReduceAxis0().axis0(x)], (7, 3)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("run,shape", [c[1:] for c in NON_FINITE], ids=[c[0] for c in NON_FINITE])
def test_nan_and_inf_inputs_propagate_and_never_crash(run, shape, bad):
    x = f32(*shape)
    x.flat[0] = bad
    outs = [o.get() for o in run(x)]
    if run is NON_FINITE[3][1] and bad == -np.inf:
        # a -inf logit is an atom of probability 0: finite outputs, the loss floored at
        # -log(1e-30) where that atom is the label
        assert all(np.isfinite(o).all() for o in outs)
    else:
        assert not all(np.isfinite(o).all() for o in outs)  # the bad element shows
    context_usable()


@pytest.mark.gpu
def test_a_bad_device_label_is_raised_by_synchronize_and_the_context_stays_usable():
    grad, ce = frd().softmax_ce_grad(f32(2, H, A), to_gpu(np.full((2, H), -2, np.int32)))
    with pytest.raises(ValueError, match=r"device labels\[0, 0\] = -2 is outside"):
        ph.synchronize()
    assert np.isnan(ce.get()).all()  # meanwhile the rows hold NaN, never plausible numbers
    context_usable()
