"""CPU: the float64 references against central differences of their own forwards, and the
analytical oracles. Every kernel is tested against these, so they are checked first."""
import numpy as np
import pytest

from pycuda_heads import reference as ref

EPS = 1e-6
RTOL = 1e-6


def numgrad(f, x, eps=EPS):
    """Central differences of the scalar f at every element of x (x is modified and restored)."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        hi = f()
        x[i] = old - eps
        lo = f()
        x[i] = old
        g[i] = (hi - lo) / (2 * eps)
    return g


def assert_close(analytic, numeric):
    scale = max(np.abs(numeric).max(), 1e-12)
    err = np.abs(analytic - numeric).max() / scale
    assert err < RTOL, f"relative error {err:.2e} >= {RTOL}"


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def test_pool_backward_matches_central_differences(rng):
    b, k, h, d = 2, 5, 3, 8
    q, ln = rng.normal(size=(h, d)), rng.normal(size=(b, k, d))
    w_ctx, w_attn = rng.normal(size=(b, h, d)), rng.normal(size=(b, h, k))

    def loss():
        ctx, attn = ref.pool_forward(q, ln)
        return float((w_ctx * ctx).sum() + (w_attn * attn).sum())

    _, attn = ref.pool_forward(q, ln)
    gq, gln = ref.pool_backward(q, ln, attn, w_ctx, grad_attn=w_attn)
    assert_close(gq, numgrad(loss, q))
    assert_close(gln, numgrad(loss, ln))


def test_pool_attention_rows_are_distributions(rng):
    ctx, attn = ref.pool_forward(rng.normal(size=(4, 16)), rng.normal(size=(3, 7, 16)))
    np.testing.assert_allclose(attn.sum(axis=-1), 1.0, rtol=1e-12)
    assert (attn > 0).all() and ctx.shape == (3, 4, 16)


def test_pool_with_one_key_copies_the_key(rng):
    ln = rng.normal(size=(2, 1, 8))
    ctx, attn = ref.pool_forward(rng.normal(size=(3, 8)), ln)
    np.testing.assert_array_equal(attn, 1.0)
    np.testing.assert_allclose(ctx, np.repeat(ln, 3, axis=1), rtol=1e-15)


def test_residual_backward_matches_central_differences(rng):
    b, h, d = 3, 4, 6
    ctx, w, bias = rng.normal(size=(b, h, d)), rng.normal(size=(h, d)), rng.normal(size=h)
    g = rng.normal(size=(b, h))

    def loss():
        return float((g * ref.residual_forward(ctx, w, bias)).sum())

    gw, gb, gctx = ref.residual_backward(ctx, w, g)
    assert_close(gw, numgrad(loss, w))
    assert_close(gb, numgrad(loss, bias))
    assert_close(gctx, numgrad(loss, ctx))


def test_gate_backward_matches_central_differences(rng):
    b, h = 4, 5
    head, res, alpha = rng.normal(size=(b, h)), rng.normal(size=(b, h)), rng.uniform(-2, 2, size=h)
    g = rng.normal(size=(b, h))

    def loss():
        return float((g * ref.gate_forward(head, res, alpha)).sum())

    gh, gr, ga = ref.gate_backward(res, alpha, g)
    assert_close(gh, numgrad(loss, head))
    assert_close(gr, numgrad(loss, res))
    assert_close(ga, numgrad(loss, alpha))


def test_gate_closed_is_the_head(rng):
    head = rng.normal(size=(6, 5))
    out = ref.gate_forward(head, rng.normal(size=(6, 5)), np.zeros(5))
    np.testing.assert_array_equal(out, head)


def test_frd_gradient_matches_central_differences(rng):
    b, h, a = 3, 2, 7
    logits = rng.normal(size=(b, h, a)) * 3
    labels = rng.integers(-1, a, size=(b, h)).astype(np.int32)
    labels[0, 0], labels[1, 1] = -1, a - 1
    grad, _ = ref.frd_softmax_ce_grad(logits, labels)
    assert_close(grad, numgrad(lambda: ref.frd_loss(logits, labels), logits))


def test_frd_uniform_logits_oracle():
    a = 21
    labels = np.arange(4 * 3, dtype=np.int32).reshape(4, 3) % a
    grad, ce = ref.frd_softmax_ce_grad(np.full((4, 3, a), 0.37), labels)
    np.testing.assert_allclose(ce, np.log(a), rtol=1e-14)
    np.testing.assert_allclose(grad.sum(axis=-1), 0.0, atol=1e-15)


def test_frd_sentinel_rows_are_zero_and_do_not_leak(rng):
    logits = rng.normal(size=(4, 3, 21)) * 5
    labels = rng.integers(0, 21, size=(4, 3)).astype(np.int32)
    labels[::2, 1] = -1
    grad, ce = ref.frd_softmax_ce_grad(logits, labels)
    live = labels >= 0
    assert (grad[~live] == 0).all() and (ce[~live] == 0).all()
    full_grad, _ = ref.frd_softmax_ce_grad(logits[live][None], labels[live][None])
    assert (ce[live] > 0).all() and np.abs(grad[live]).min() > 0
    # the live rows equal the same rows computed alone, up to the 1/B factor
    np.testing.assert_allclose(grad[live] * 4, full_grad[0] * 1, rtol=1e-12)


def test_frd_extreme_logits_stay_finite():
    logits = np.zeros((1, 1, 21))
    logits[0, 0, 3] = 1e4
    grad, ce = ref.frd_softmax_ce_grad(logits, np.array([[5]], dtype=np.int32))
    assert np.isfinite(grad).all()
    np.testing.assert_allclose(ce, -np.log(ref.CE_FLOOR))


def test_frd_rejects_out_of_range_labels():
    with pytest.raises(ValueError, match=r"labels\[1, 0\] = 21"):
        ref.frd_softmax_ce_grad(np.zeros((2, 1, 21)), np.array([[0], [21]], dtype=np.int32))


def test_reduce_axis0_is_a_column_sum(rng):
    x = rng.normal(size=(37, 11))
    np.testing.assert_allclose(ref.reduce_axis0(x), x.sum(axis=0), rtol=1e-15)


def test_float32_reference_is_the_same_math(rng):
    q, ln = rng.normal(size=(5, 32)), rng.normal(size=(2, 9, 32))
    c64, _ = ref.pool_forward(q, ln)
    c32, _ = ref.pool_forward(q, ln, dtype=np.float32)
    assert c32.dtype == np.float32
    np.testing.assert_allclose(c32, c64, rtol=1e-4, atol=1e-5)


def test_resgate_backward_matches_central_differences(rng):
    b, h, d = 3, 4, 6
    ctx, w, bias = rng.normal(size=(b, h, d)), rng.normal(size=(h, d)), rng.normal(size=h)
    head, alpha = rng.normal(size=(b, h)), rng.uniform(-2, 2, size=h)
    g = rng.normal(size=(b, h))

    def loss():
        return float((g * ref.resgate_forward(ctx, w, bias, head, alpha)[0]).sum())

    _, residual = ref.resgate_forward(ctx, w, bias, head, alpha)
    gw, gb, gctx, gh, ga = ref.resgate_backward(ctx, w, alpha, residual, g)
    for analytic, x in ((gw, w), (gb, bias), (gctx, ctx), (gh, head), (ga, alpha)):
        assert_close(analytic, numgrad(loss, x))


def test_resgate_is_the_residual_then_the_gate_and_closed_is_the_head(rng):
    ctx, w, bias = rng.normal(size=(4, 3, 8)), rng.normal(size=(3, 8)), rng.normal(size=3)
    head, alpha = rng.normal(size=(4, 3)), rng.uniform(-2, 2, size=3)
    out, residual = ref.resgate_forward(ctx, w, bias, head, alpha)
    np.testing.assert_array_equal(residual, ref.residual_forward(ctx, w, bias))
    np.testing.assert_array_equal(out, ref.gate_forward(head, residual, alpha))
    closed, _ = ref.resgate_forward(ctx, w, bias, head, np.zeros(3))
    np.testing.assert_array_equal(closed, head)


def _frdhead_inputs(rng, b=4, d=6, f=7, h=2, a=5):
    return (rng.normal(size=(b, d)), rng.normal(size=(f, d)), rng.normal(size=f),
            rng.normal(size=(h, a, f)), rng.normal(size=(h, a)))


def test_frdhead_gradients_match_central_differences(rng):
    h_t, w1, b1, w2, b2 = x = _frdhead_inputs(rng)
    labels = rng.integers(-1, 5, size=(4, 2)).astype(np.int32)
    labels[0] = -1
    pre = h_t @ w1.T + b1
    assert np.abs(pre).min() > 1e-3 and (pre < 0).any()  # no probe crosses a ReLU kink

    def loss():
        return ref.frdhead_loss(*x, labels)

    hidden, logits = ref.frdhead_forward(*x)
    grad_logits, _ = ref.frd_softmax_ce_grad(logits, labels)
    gw2, gb2, dhidden = ref.frdhead_grad_w2(hidden, w2, grad_logits)
    gw1, gb1, gh = ref.frdhead_grad_w1(h_t, w1, hidden, dhidden)
    for analytic, param in ((gw1, w1), (gb1, b1), (gw2, w2), (gb2, b2), (gh, h_t)):
        assert_close(analytic, numgrad(loss, param))


def test_frdhead_inactive_units_pass_no_gradient(rng):
    h_t, w1, b1, w2, b2 = _frdhead_inputs(rng)
    b1[3] = -100.0
    hidden, _ = ref.frdhead_forward(h_t, w1, b1, w2, b2)
    gw1, gb1, gh = ref.frdhead_grad_w1(h_t, w1, hidden, rng.normal(size=hidden.shape))
    assert (hidden[:, 3] == 0).all() and (gw1[3] == 0).all() and gb1[3] == 0


def test_adam_first_step_moves_each_parameter_by_lr(rng):
    p, g = rng.normal(size=50), rng.normal(size=50)
    new, m, v = ref.adam_step(p, g, np.zeros(50), np.zeros(50), t=1, lr=0.01, eps=0.0)
    np.testing.assert_allclose(new, p - 0.01 * np.sign(g), rtol=1e-14)
    np.testing.assert_allclose(m, 0.1 * g, rtol=1e-14)
    np.testing.assert_allclose(v, 0.001 * g * g, rtol=1e-14)


def test_adam_bias_correction_at_step_t(rng):
    p, g, m0, v0 = rng.normal(size=8), rng.normal(size=8), rng.normal(size=8), rng.random(8)
    new, m, v = ref.adam_step(p, g, m0, v0, t=4)
    m_hat, v_hat = m / (1 - 0.9 ** 4), v / (1 - 0.999 ** 4)
    np.testing.assert_allclose(new, p - 1e-3 * m_hat / (np.sqrt(v_hat) + 1e-8), rtol=1e-14)
