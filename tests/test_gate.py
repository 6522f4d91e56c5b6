"""GPU: the alpha gate; closed gate bit-identical to the head, gradients by central differences."""
import numpy as np
import pytest

import pycuda_heads as ph
from gpu_helpers import assert_variant_passes, grid_params, oracles

pytestmark = pytest.mark.gpu
F32 = np.float32


@pytest.mark.parametrize("template,shape", grid_params("gate.forward"))
def test_forward_matches_reference(template, shape):
    assert_variant_passes("gate.forward", template, shape)


@pytest.mark.parametrize("template,shape", grid_params("gate.backward"))
def test_backward_matches_reference(template, shape):
    assert_variant_passes("gate.backward", template, shape)


def test_closed_gate_is_bitwise_the_head_and_gradients_match_central_differences():
    checks = oracles("gate.forward")
    assert checks["closed_gate_bitwise"]["passed"]
    assert checks["parity_numgrad"]["passed"], checks["parity_numgrad"]


def test_closed_gate_keeps_negative_zero_and_large_values():
    gate = ph.AlphaGate(5)
    head = np.array([[-0.0, 1e30, -3.5, 7.0, 1e-38]] * 3, F32)
    out = gate.forward(head, np.full((3, 5), 1e30, F32), np.zeros(5, F32)).get()
    assert out.tobytes() == head.tobytes()


def test_bad_inputs_raise():
    gate = ph.AlphaGate(5)
    with pytest.raises(ValueError, match=r"alpha: expected shape \(H\) = \(5,\), got \(3,\)"):
        gate.forward(np.ones((2, 5), F32), np.ones((2, 5), F32), np.ones(3, F32))
    with pytest.raises(ValueError, match="n_horizons must be a positive int"):
        ph.AlphaGate(0)
