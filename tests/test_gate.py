"""GPU: the alpha gate beyond test_kernels.py: which oracles it has, a closed gate keeping
negative zero and extreme values, bad inputs."""
import numpy as np
import pytest

import pycuda_heads as ph
from gpu_helpers import suite_oracles

pytestmark = pytest.mark.gpu
F32 = np.float32


def test_oracles_are_the_closed_gate_and_central_differences():
    """test_kernels.py asserts that they pass; here, that neither is dropped."""
    assert {"closed_gate_bitwise", "parity_numgrad"} <= set(suite_oracles("gate.forward"))


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
