"""GPU: the deterministic reduce.axis0 kernel beyond test_kernels.py: multi-stage launch
parameters (each level reading the one before, launched with programmatic dependent launch), the
public function and its errors."""
import numpy as np
import pytest

import pycuda_heads as ph
from gpu_helpers import assert_pdl_gives_plain_bits, assert_variant_passes
from pycuda_heads.ops.reduce import ReduceAxis0

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("params", [{"TX": 128, "TY": 8, "SPLIT_ROWS": 64},
                                    {"TX": 32, "TY": 1, "SPLIT_ROWS": 4096}])
def test_multi_stage_configurations(params):
    assert_variant_passes("reduce.axis0", {}, {"N": 70001, "M": 97}, params)


def test_levels_launched_dependently_give_the_plain_bits(monkeypatch):
    """Each level's launch may begin while the level before still writes its rows."""
    import pycuda.gpuarray as gpuarray
    x = gpuarray.to_gpu(np.random.default_rng(5).standard_normal((70001, 97), dtype=np.float32))

    def chain():
        op = ReduceAxis0(launch={"axis0": {"TX": 32, "TY": 8, "SPLIT_ROWS": 64}})
        return op, [op.axis0(x) for _ in range(3)]

    assert_pdl_gives_plain_bits(monkeypatch, chain)


def test_public_function_and_errors():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(ph.reduce_axis0(x).get(), x.sum(axis=0))
    with pytest.raises(ValueError, match=r"x: expected a 2-d array \(N, M\)"):
        ph.reduce_axis0(x[0])
