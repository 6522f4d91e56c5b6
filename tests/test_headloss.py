"""The head's training loss: its float64 reference is the derivative of its loss (CPU); the
kernel's oracles at other launch parameters, and a single block returning the loss with no
reduce launch (GPU)."""
import numpy as np
import pytest

from pycuda_heads.ops import headloss
from gpu_helpers import oracles

KERNEL = "headloss.grad"


def test_the_reference_gradient_is_the_derivative_of_its_loss():
    rng = np.random.default_rng(3)
    out, y, ce = (rng.standard_normal((4, 5)) for _ in range(3))
    g = rng.standard_normal((4, 5, 21))
    grad_out, grad_logits_w, loss = headloss.reference(out, y, ce, g)
    eps = 1e-6
    for i, j in ((0, 0), (3, 4), (2, 1)):
        plus, minus = out.copy(), out.copy()
        plus[i, j] += eps
        minus[i, j] -= eps
        num = (headloss.reference(plus, y, ce, g)[2][0]
               - headloss.reference(minus, y, ce, g)[2][0]) / (2 * eps)
        assert num == pytest.approx(grad_out[i, j], rel=1e-7)
    assert np.array_equal(grad_logits_w, headloss.FRD_WEIGHT * g)
    want = np.mean((out - y) ** 2) + headloss.FRD_WEIGHT * ce.sum() / 4
    assert loss.shape == (1,) and loss[0] == pytest.approx(want, rel=1e-15)


@pytest.mark.gpu
@pytest.mark.parametrize("params", [{"BLOCK": 64, "ROWS": 8}, {"BLOCK": 512, "ROWS": 512}],
                         ids=["B64-R8", "B512-R512"])
def test_loss_numgrad_oracle(params):
    result = oracles(KERNEL, params=params)["loss_numgrad"]
    assert result["passed"], result


@pytest.mark.gpu
def test_one_block_writes_the_loss_itself():
    from pycuda_heads.core.compile import recorded_launches
    rng = np.random.default_rng(4)
    x = [rng.standard_normal(s, dtype=np.float32) for s in ((6, 5), (6, 5), (6, 5), (6, 5, 21))]
    op = headloss.HeadLoss(5, launch={"grad": {"ROWS": 8}})
    with recorded_launches() as launches:
        got = [a.get() for a in op.grad(*x)]
    assert len(launches) == 1
    want = headloss.reference(*x)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-7)
