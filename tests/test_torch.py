"""GPU: pycuda_heads.torch against torch's own autograd of the same math, on torch's default and
side streams, inside torch.cuda.graph capture, and in a small Adam training loop."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

import pycuda_heads.torch as pht  # noqa: E402  (needs torch)


def close(a, b, tol=1e-4):
    return float((a - b).abs().max()) <= tol * max(float(b.abs().max()), 1e-30)


def reference_pool(q_h, ln):
    attn = torch.softmax(q_h @ ln.transpose(1, 2) / math.sqrt(q_h.shape[1]), dim=-1)
    return attn @ ln, attn


def leaves(*shapes, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(*s, device="cuda", generator=g).requires_grad_(True) for s in shapes]


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")


def test_pool_forward_and_gradients_match_torch():
    pool = pht.AttentionPool(5, 128)
    (ln,) = leaves((3, 33, 128))
    ctx, attn = pool(ln)
    g = torch.randn_like(ctx)
    gq, gln = torch.autograd.grad(ctx, [pool.q_h, ln], g)
    q = pool.q_h.detach().clone().requires_grad_(True)
    ln2 = ln.detach().clone().requires_grad_(True)
    ctx2, attn2 = reference_pool(q, ln2)
    gq2, gln2 = torch.autograd.grad(ctx2, [q, ln2], g)
    assert close(ctx, ctx2) and close(attn, attn2) and close(gq, gq2) and close(gln, gln2)


@pytest.mark.parametrize("through", ["ctx", "attn", "both"])
def test_pool_gradients_through_either_output_match_torch(through):
    pool = pht.AttentionPool(5, 128)
    (ln,) = leaves((3, 33, 128), seed=5)
    q = pool.q_h.detach().clone().requires_grad_(True)
    ln2 = ln.detach().clone().requires_grad_(True)
    outputs, wanted = pool(ln), reference_pool(q, ln2)
    pick = {"ctx": [0], "attn": [1], "both": [0, 1]}[through]
    gs = [torch.randn_like(outputs[i]) for i in pick]
    got = torch.autograd.grad([outputs[i] for i in pick], [pool.q_h, ln], gs)
    want = torch.autograd.grad([wanted[i] for i in pick], [q, ln2], gs)
    assert all(close(a, b) for a, b in zip(got, want))


def test_residual_gate_forward_and_gradients_match_torch():
    rg = pht.ResidualGate(5, 128)
    with torch.no_grad():
        rg.alpha.uniform_(-1, 1)
        rg.bias_res.normal_()
    c, head = leaves((4, 5, 128), (4, 5), seed=1)
    out = rg(c, head)
    g = torch.randn_like(out)
    params = [c, head, rg.w_res, rg.bias_res, rg.alpha]
    got = torch.autograd.grad(out, params, g)
    p2 = [p.detach().clone().requires_grad_(True) for p in params]
    want_out = p2[1] + torch.tanh(p2[4]) * ((p2[0] * p2[2]).sum(-1) + p2[3])
    want = torch.autograd.grad(want_out, p2, g)
    assert close(out, want_out)
    assert all(close(a, b) for a, b in zip(got, want))


def test_closed_gate_returns_the_head_bitwise():
    rg = pht.ResidualGate(5, 128)
    c, head = leaves((4, 5, 128), (4, 5), seed=2)
    assert torch.equal(rg(c, head), head)


def test_frd_loss_and_gradient_match_torch_cross_entropy():
    loss_fn = pht.FrdLoss(5, 21)
    (logits,) = leaves((64, 5, 21), seed=3)
    labels = torch.randint(-1, 21, (64, 5), device="cuda", dtype=torch.int32)
    loss = loss_fn(logits, labels)
    (g,) = torch.autograd.grad(loss, [logits])
    x = logits.detach().clone().requires_grad_(True)
    flat, lab = x.reshape(-1, 21), labels.reshape(-1).long()
    live = lab >= 0
    want = torch.nn.functional.cross_entropy(flat[live], lab[live], reduction="sum") / 64
    (g2,) = torch.autograd.grad(want, [x])
    assert close(loss, want) and close(g, g2)


def test_frd_head_forward_and_gradients_match_torch():
    head = pht.FrdHead(128, 128, 5, 21)
    with torch.no_grad():
        head.b1.normal_()
        head.b2.normal_()
    (h_t,) = leaves((37, 128), seed=4)
    logits = head(h_t)
    g = torch.randn_like(logits)
    params = [h_t, head.w1, head.b1, head.w2, head.b2]
    got = torch.autograd.grad(logits, params, g)
    p2 = [p.detach().clone().requires_grad_(True) for p in params]
    hidden = torch.relu(p2[0] @ p2[1].T + p2[2])
    want_logits = (hidden @ p2[3].reshape(105, 128).T + p2[4].reshape(-1)).reshape(37, 5, 21)
    want = torch.autograd.grad(want_logits, p2, g)
    assert close(logits, want_logits)
    assert all(close(a, b) for a, b in zip(got, want))


def test_side_stream_and_graph_capture_match_eager():
    pool, rg = pht.AttentionPool(5, 128), pht.ResidualGate(5, 128)
    with torch.no_grad():
        rg.alpha.fill_(0.5)
    ln = torch.randn(2, 8, 128, device="cuda")
    head = torch.randn(2, 5, device="cuda")

    def step():
        ctx, _ = pool(ln)
        out = rg(ctx, head)
        return [out, *torch.autograd.grad(out.sum(), [pool.q_h, rg.w_res, rg.alpha])]

    eager = [t.detach().clone() for t in step()]
    side = torch.cuda.Stream()  # also the warm-up torch asks for before a capture
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = [t.detach().clone() for t in step()]
    torch.cuda.current_stream().wait_stream(side)
    assert all(torch.equal(a, b) for a, b in zip(eager, on_side))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(eager, captured))


def test_adam_training_loss_falls():
    torch.manual_seed(0)
    pool, rg = pht.AttentionPool(5, 64), pht.ResidualGate(5, 64)
    teacher_q = torch.randn(5, 64, device="cuda")
    opt = torch.optim.Adam([*pool.parameters(), *rg.parameters()], lr=3e-2)
    losses = []
    for i in range(150):
        ln = torch.randn(32, 16, 64, device="cuda")
        head = torch.zeros(32, 5, device="cuda")
        with torch.no_grad():
            target = reference_pool(teacher_q, ln)[0].sum(-1) * 0.1
        loss = ((rg(pool(ln)[0], head) - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert np.isfinite(losses).all()
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])
    assert float(rg.alpha.abs().max()) > 0
