"""GPU: the Adam step beyond test_kernels.py: its in-place oracle at other launch parameters,
in place against out of place, bad arguments."""
import numpy as np
import pytest

import pycuda_heads as ph
from pycuda_heads import reference as ref
from gpu_helpers import oracles

pytestmark = pytest.mark.gpu
KERNEL = "adam.step"


@pytest.mark.parametrize("params", [{"BLOCK": 64, "ITEMS": 8}, {"BLOCK": 1024, "ITEMS": 1}],
                         ids=lambda p: f"B{p['BLOCK']}-I{p['ITEMS']}")
def test_steps_in_place_oracle(params):
    result = oracles(KERNEL, params=params)["steps_in_place"]
    assert result["passed"], result


def test_out_of_place_leaves_inputs_and_in_place_matches_it():
    import pycuda.gpuarray as gpuarray
    rng = np.random.default_rng(5)
    p, g, m = (rng.standard_normal((33, 7), dtype=np.float32) for _ in range(3))
    v = rng.random((33, 7), dtype=np.float32)
    adam = ph.Adam(lr=0.01)
    dev = [gpuarray.to_gpu(a) for a in (p, m, v)]
    out = [o.get() for o in adam.step(dev[0], g, dev[1], dev[2], 4)]
    assert all((d.get() == a).all() for d, a in zip(dev, (p, m, v)))
    adam.step(dev[0], g, dev[1], dev[2], 4, inplace=True)
    assert all(d.get().tobytes() == o.tobytes() for d, o in zip(dev, out))
    want = ref.adam_step(p, g, m, v, 4, lr=0.01)
    for got, w in zip(out, want):
        np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-7)


def test_bad_arguments_raise():
    adam = ph.Adam()
    x = np.ones(5, np.float32)
    with pytest.raises(ValueError, match="t: expected the step number"):
        adam.step(x, x, x, x, 0)
    with pytest.raises(ValueError, match=r"grad: expected shape"):
        adam.step(x, np.ones(6, np.float32), x, x, 1)
    with pytest.raises(TypeError, match="inplace=True needs device arrays"):
        adam.step(x, x, x, x, 1, inplace=True)
