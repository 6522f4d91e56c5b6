"""GPU: FRD softmax + cross-entropy gradient beyond test_kernels.py: the oracles and references
of every layout, bad labels on the host and on the device."""
import numpy as np
import pytest

import pycuda_heads as ph
from pycuda_heads.catalog import catalog
from gpu_helpers import assert_variant_passes, oracles

pytestmark = pytest.mark.gpu
F32 = np.float32
KERNEL = "frd.softmax_ce_grad"
LAYOUTS = [{"LAYOUT": 0, "TPR": 1, "BLOCK": 64, "STAGE": 0},
           {"LAYOUT": 1, "TPR": 1, "BLOCK": 128, "STAGE": 1},
           {"LAYOUT": 1, "TPR": 8, "BLOCK": 256, "STAGE": 0},
           {"LAYOUT": 1, "TPR": 32, "BLOCK": 64, "STAGE": 1},
           {"LAYOUT": 2, "TPR": 1, "BLOCK": 128, "STAGE": 0, "CPW": 1},
           {"LAYOUT": 2, "TPR": 1, "BLOCK": 256, "STAGE": 0, "CPW": 4}]


@pytest.mark.parametrize("params", LAYOUTS, ids=lambda p: "L{LAYOUT}-T{TPR}-B{BLOCK}-S{STAGE}".format(**p) + f"-C{p.get('CPW', 1)}")
@pytest.mark.parametrize("check", ["uniform_logits", "sentinel_rows", "finite_differences"])
def test_oracles(params, check):
    result = oracles(KERNEL, params=params)[check]
    assert result["passed"], result


@pytest.mark.parametrize("n_atoms,params", [
    pytest.param(a, p, id=f"A{a}-L{p['LAYOUT']}-T{p['TPR']}-S{p['STAGE']}-C{p.get('CPW', 1)}")
    for a in (11, 21, 51) for p in LAYOUTS[1:]
    if catalog()[KERNEL].space.violated(catalog()[KERNEL].space.complete(p),
                                        {"N_HORIZONS": 5, "N_ATOMS": a}) is None])
def test_layouts_match_reference(n_atoms, params):
    template = {"N_HORIZONS": 5, "N_ATOMS": n_atoms}
    assert_variant_passes(KERNEL, template, {"B": 203}, params)


def test_bad_labels_raise_naming_the_first_position():
    import pycuda.gpuarray as gpuarray
    frd = ph.FrdSoftmaxCE(5, 21)
    logits = np.ones((4, 5, 21), F32)
    labels = np.zeros((4, 5), np.int32)
    labels[2, 3], labels[3, 0] = 21, -2
    with pytest.raises(ValueError, match=r"labels\[2, 3\] = 21 is outside \[-1, 21\)"):
        frd.softmax_ce_grad(logits, labels)
    grad, ce = frd.softmax_ce_grad(logits, gpuarray.to_gpu(labels))  # checked on the device
    with pytest.raises(ValueError, match=r"device labels\[2, 3\] = 21"):
        ph.synchronize()
    assert np.isnan(ce.get()[2, 3]) and np.isnan(grad.get()[2, 3]).all()
    with pytest.raises(TypeError, match="labels: expected dtype int32, got int64"):
        frd.softmax_ce_grad(logits, labels.astype(np.int64))


def test_device_label_check_names_the_first_bad_position_at_the_next_call():
    import pycuda.gpuarray as gpuarray
    frd = ph.FrdSoftmaxCE(5, 21)
    b = 6000  # 30000 rows: several check blocks; the bad labels sit in different ones
    labels = np.random.default_rng(3).integers(-1, 21, size=(b, 5)).astype(np.int32)
    labels[2500, 4], labels[5999, 0] = 30, -7
    logits = np.random.default_rng(4).standard_normal((b, 5, 21)).astype(F32)
    frd.softmax_ce_grad(logits, gpuarray.to_gpu(labels))
    # No wait here: the tests synchronise after each launch (conftest), so the next call finds
    # the check finished and raises.
    with pytest.raises(ValueError, match=r"device labels\[2500, 4\] = 30"):
        frd.softmax_ce_grad(logits, gpuarray.to_gpu(np.zeros((b, 5), np.int32)))
    labels[2500, 4], labels[5999, 0] = 3, 4
    grad, _ = frd.softmax_ce_grad(logits, gpuarray.to_gpu(labels))
    ph.synchronize()  # good labels: nothing raised, and the context is still usable
    assert np.isfinite(grad.get()).all()


def test_unchecked_bad_labels_give_nan_rows_not_garbage():
    import pycuda.gpuarray as gpuarray
    frd = ph.FrdSoftmaxCE(5, 21)
    labels = np.zeros((2, 5), np.int32)
    labels[1, 2] = 99
    grad, ce = frd.softmax_ce_grad(np.ones((2, 5, 21), F32), gpuarray.to_gpu(labels),
                                   check_labels=False)
    grad, ce = grad.get(), ce.get()
    assert np.isnan(grad[1, 2]).all() and np.isnan(ce[1, 2])
    assert np.isfinite(np.delete(grad.reshape(10, 21), 7, axis=0)).all()
