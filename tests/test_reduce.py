"""GPU: the deterministic reduce.axis0 kernel beyond test_kernels.py: multi-stage launch
parameters, the public function and its errors."""
import numpy as np
import pytest

import pycuda_heads as ph
from gpu_helpers import assert_variant_passes

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("params", [{"TX": 128, "TY": 8, "SPLIT_ROWS": 64},
                                    {"TX": 32, "TY": 1, "SPLIT_ROWS": 4096}])
def test_multi_stage_configurations(params):
    assert_variant_passes("reduce.axis0", {}, {"N": 70001, "M": 97}, params)


def test_public_function_and_errors():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(ph.reduce_axis0(x).get(), x.sum(axis=0))
    with pytest.raises(ValueError, match=r"x: expected a 2-d array \(N, M\)"):
        ph.reduce_axis0(x[0])
