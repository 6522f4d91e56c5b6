"""GPU: pycuda_heads.torch against torch's own autograd of the same math, on torch's default and
side streams, inside torch.cuda.graph capture, under torch.compile (default and reduce-overhead)
and torch.library.opcheck, with bad inputs refused by name, and in a small Adam training loop."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

import pycuda_heads.torch as pht  # noqa: E402  (needs torch)
from pycuda_heads.perf import torch_train  # noqa: E402
from pycuda_heads.step import SMALL_BATCH  # noqa: E402
from pycuda_heads.torch import ops as pht_ops  # noqa: E402
from pycuda_heads.torch.native import native  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402  (inductor's own tally of cudagraph skips)


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


@pytest.mark.parametrize("b,k", [(3, 33), (2, 4096)])  # (2, 4096): rows split in 16
@pytest.mark.parametrize("through", ["ctx", "attn", "both"])
def test_pool_gradients_through_either_output_match_torch(through, b, k):
    pool = pht.AttentionPool(5, 128)
    (ln,) = leaves((b, k, 128), seed=5)
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
    # the eager loss is one node; the operator's composition (what torch.compile traces) agrees
    _, ce = pht.frd_softmax_ce(logits, labels, loss_fn.op_id)
    composed = ce.sum() / 64
    (g3,) = torch.autograd.grad(composed * 3, [logits])
    (g4,) = torch.autograd.grad(loss_fn(logits, labels) * 3, [logits])
    assert torch.equal(composed, loss) and close(g3, g4, 1e-6)


@pytest.mark.parametrize("b", [37, SMALL_BATCH + 1])  # FrdHeadSmall's kernels, FrdHead's
def test_frd_head_forward_and_gradients_match_torch(b):
    head = pht.FrdHead(128, 128, 5, 21)
    assert type(pht_ops._ops[head.op_id_for(b)]).__name__ == (
        "FrdHeadSmall" if b <= SMALL_BATCH else "FrdHead")
    with torch.no_grad():
        head.b1.normal_()
        head.b2.normal_()
    (h_t,) = leaves((b, 128), seed=4)
    logits = head(h_t)
    g = torch.randn_like(logits)
    params = [h_t, head.w1, head.b1, head.w2, head.b2]
    got = torch.autograd.grad(logits, params, g)
    p2 = [p.detach().clone().requires_grad_(True) for p in params]
    hidden = torch.relu(p2[0] @ p2[1].T + p2[2])
    want_logits = (hidden @ p2[3].reshape(105, 128).T + p2[4].reshape(-1)).reshape(b, 5, 21)
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


# ---- the operators: programs against the op methods, opcheck, compile, bad input ----

from pycuda_heads.ops.frd import FrdSoftmaxCE  # noqa: E402
@pytest.mark.parametrize("b", [37, SMALL_BATCH + 1])  # FrdHeadSmall's kernels, FrdHead's
def test_the_heads_fused_loss_matches_head_then_loss_eager_and_compiled(b):
    """FrdHead.forward_loss against FrdHead then FrdLoss: logits bitwise, the loss and every
    gradient within float32 rounding, eagerly and under torch.compile(fullgraph=True)."""
    head, loss_fn = pht.FrdHead(128, 128, 5, 21), pht.FrdLoss(5, 21)
    with torch.no_grad():
        head.b1.normal_()
        head.b2.normal_()
    (h_t,) = leaves((b, 128), seed=5)
    labels = _labels(b, seed=6)
    params = [h_t, *head.parameters()]
    logits = head(h_t)
    want = loss_fn(logits, labels)
    want_grads = torch.autograd.grad(want, params)
    for fn in (head.forward_loss, torch.compile(head.forward_loss, fullgraph=True)):
        got_logits, got = fn(h_t, labels)
        assert torch.equal(got_logits, logits)
        assert close(got, want, 1e-5)
        assert all(close(a, w, 1e-5) for a, w in zip(torch.autograd.grad(got, params),
                                                      want_grads))


from pycuda_heads.ops.frdhead import FrdHead as FrdHeadOp  # noqa: E402
from pycuda_heads.ops.pool import PerHorizonAttentionPool  # noqa: E402
from pycuda_heads.ops.resgate import ResidualGate as ResidualGateOp  # noqa: E402

H, D, A, F, I = 5, 128, 21, 128, 128


def _rand(*shape, seed=0, scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=g) * scale


def _labels(b, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(-1, A, (b, H), device="cuda", generator=g, dtype=torch.int32)


def _arrays(*tensors):
    """The same values as NumPy arrays, for the op methods."""
    return [t.detach().cpu().numpy() for t in tensors]


def operator_cases(b, k):
    """name -> (op object, tensor arguments, the op method's outputs from the same values)."""
    pool, rg = PerHorizonAttentionPool(H, D), ResidualGateOp(H, D)
    frd, head = FrdSoftmaxCE(H, A), FrdHeadOp(I, F, H, A)
    q_h, ln = _rand(H, D, seed=1), _rand(b, k, D, seed=2)
    ctx, attn = (torch.from_numpy(a.get()).cuda() for a in pool.forward(*_arrays(q_h, ln)))
    grad_ctx, grad_attn = _rand(b, H, D, seed=3), _rand(b, H, k, seed=4)
    c, w_res, bias, hd, alpha = (_rand(b, H, D, seed=5), _rand(H, D, seed=6), _rand(H, seed=7),
                                 _rand(b, H, seed=8), _rand(H, seed=9))
    residual = torch.from_numpy(rg.forward(*_arrays(c, w_res, bias, hd, alpha))[1].get()).cuda()
    grad_out = _rand(b, H, seed=10)
    logits, labels = _rand(b, H, A, seed=11), _labels(b, seed=12)
    h_t, w1, b1, w2, b2 = (_rand(b, I, seed=13), _rand(F, I, seed=14, scale=0.1),
                           _rand(F, seed=15), _rand(H, A, F, seed=16, scale=0.1),
                           _rand(H, A, seed=17))
    hidden = torch.from_numpy(head.forward(*_arrays(h_t, w1, b1, w2, b2))[0].get()).cuda()
    grad_logits, dhidden = _rand(b, H, A, seed=18), _rand(b, F, seed=19)
    labels_h = _labels(b, seed=20)
    row = lambda *parts: np.concatenate([p.get().ravel() for p in parts])  # noqa: E731
    rgb = rg.backward(*_arrays(c, w_res, alpha, residual, grad_out))
    g2, g1 = head.grad_w2(*_arrays(hidden, w2, grad_logits)), head.grad_w1(
        *_arrays(h_t, w1, hidden, dhidden))
    gb = head.backward(*_arrays(h_t, w1, w2, hidden, grad_logits))
    return {
        "pool_forward": (pool, [q_h, ln], [a.get() for a in pool.forward(*_arrays(q_h, ln))]),
        "pool_backward": (pool, [q_h, ln, attn, grad_ctx, ctx, grad_attn],
                          [a.get() for a in pool.backward(*_arrays(q_h, ln, attn, grad_ctx, ctx),
                                                          grad_attn=_arrays(grad_attn)[0])]),
        "resgate_forward": (rg, [c, w_res, bias, hd, alpha],
                            [a.get() for a in rg.forward(*_arrays(c, w_res, bias, hd, alpha))]),
        "resgate_backward": (rg, [c, w_res, alpha, residual, grad_out],
                             [rgb[2].get(), row(rgb[0], rgb[1], rgb[4])]),
        "frd_softmax_ce": (frd, [logits, labels],
                           [a.get() for a in frd.softmax_ce_grad(*_arrays(logits, labels))]),
        "frdhead_forward": (head, [h_t, w1, b1, w2, b2],
                            [a.get() for a in head.forward(*_arrays(h_t, w1, b1, w2, b2))]),
        "frdhead_forward_loss": (head, [h_t, w1, b1, w2, b2, labels_h],
                                 [a.get() for a in head.forward_loss(
                                     *_arrays(h_t, w1, b1, w2, b2, labels_h))]),
        "frdhead_grad_w2": (head, [hidden, w2, grad_logits], [row(g2[0], g2[1]), g2[2].get()]),
        "frdhead_grad_w1": (head, [h_t, w1, hidden, dhidden], [row(g1[0], g1[1]), g1[2].get()]),
        "frdhead_backward": (head, [h_t, w1, w2, hidden, grad_logits],
                             [row(gb[0], gb[1]), row(gb[2], gb[3]), gb[4].get()]),
    }


SHAPES = ((3, 33), (64, 64), (4096, 8))  # B=4096 gives the backward passes several row groups


@pytest.mark.parametrize("b,k", SHAPES)
def test_each_operator_gives_the_op_methods_bits(b, k):
    for name, (op, tensors, want) in operator_cases(b, k).items():
        got = getattr(torch.ops.pycuda_heads, name)(*tensors, pht.register(op))
        for g, w in zip(got, want):
            assert g.shape == tuple(w.shape) and np.array_equal(g.cpu().numpy(), w), name


@pytest.mark.parametrize("b,k", SHAPES)
def test_opcheck_passes_for_every_operator(b, k):
    differentiable = {"pool_forward": (0, 1), "resgate_forward": (0, 1, 2, 3, 4),
                      "frd_softmax_ce": (0,), "frdhead_forward": (0, 1, 2, 3, 4),
                      "frdhead_forward_loss": (0, 1, 2, 3, 4)}
    for name, (op, tensors, _) in operator_cases(b, k).items():
        args = [t.detach().clone().requires_grad_(i in differentiable.get(name, ()))
                for i, t in enumerate(tensors)]
        torch.library.opcheck(getattr(torch.ops.pycuda_heads, name), (*args, pht.register(op)))
    adam = __import__("pycuda_heads.ops.adam", fromlist=["Adam"]).Adam()
    p, g, m = _rand(1000, seed=20), _rand(1000, seed=21), _rand(1000, seed=22)
    torch.library.opcheck(torch.ops.pycuda_heads.adam_step,
                          (p, g, m, m.abs() * 1e-2, 3, pht.register(adam)))


def test_adam_step_operator_matches_torch_adam():
    adam = __import__("pycuda_heads.ops.adam", fromlist=["Adam"]).Adam()
    p = torch.nn.Parameter(_rand(3001, seed=23))
    ours = p.detach().clone()
    m, v = torch.zeros_like(ours), torch.zeros_like(ours)
    opt = torch.optim.Adam([p], lr=adam.lr, betas=(adam.beta1, adam.beta2), eps=adam.eps)
    for t in range(1, 6):
        g = _rand(3001, seed=30 + t)
        p.grad = g.clone()
        opt.step()
        pht.adam_step(ours, g, m, v, t, pht.register(adam))
    assert close(ours, p.detach(), 1e-5)


def _model(name, b):
    shape = {"frd": {"B": b}, "pool": {"B": b, "K": 16}}[name]
    library, _, params, _ = torch_train.models(torch, name)
    return library, params, torch_train.batch(torch, name, shape)


def _loss_and_grads(fn, params, inputs, steps=1):
    for _ in range(steps):  # reduce-overhead records on the first calls, replays after
        torch.compiler.cudagraph_mark_step_begin()
        loss = fn(*inputs)
        grads = torch.autograd.grad(loss, params)
        out = [loss.detach().clone(), *(g.detach().clone() for g in grads)]
    return out


@pytest.mark.parametrize("name", torch_train.MODELS)
def test_compile_fullgraph_has_no_graph_break_and_matches_eager(name):
    fn, params, inputs = _model(name, 64)
    explained = torch._dynamo.explain(fn)(*inputs)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained
    eager = _loss_and_grads(fn, params, inputs)
    for mode in ("default", "reduce-overhead"):
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(fn, mode=mode, fullgraph=True)
        got = _loss_and_grads(compiled, params, inputs, steps=3)
        assert all(close(a, b, 1e-5) for a, b in zip(got, eager)), mode
    # the library's operators did not make inductor run the graphs without CUDA graphs
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])


def test_deterministic_algorithms_give_the_same_bits_twice():
    torch.use_deterministic_algorithms(True)
    try:
        runs = [_loss_and_grads(*_model(name, 512)) for name in torch_train.MODELS
                for _ in range(2)]
    finally:
        torch.use_deterministic_algorithms(False)
    for first, second in (runs[0:2], runs[2:4]):
        assert all(torch.equal(a, b) for a, b in zip(first, second))


def _bad_inputs():
    pool, rg, loss = pht.AttentionPool(H, D), pht.ResidualGate(H, D), pht.FrdLoss(H, A)
    head = pht.FrdHead(I, F, H, A)
    ln, c, hd = _rand(4, 9, D), _rand(4, H, D), _rand(4, H)
    logits, labels, h_t = _rand(4, H, A), _labels(4), _rand(4, I)
    adam = pht.register(__import__("pycuda_heads.ops.adam", fromlist=["Adam"]).Adam())
    return [
        ("ln on the CPU", lambda: pool(ln.cpu()), TypeError, "ln"),
        ("ln float64", lambda: pool(ln.double()), TypeError, "ln"),
        ("ln float16", lambda: pool(ln.half()), TypeError, "ln"),
        ("ln on the meta device", lambda: pool(torch.empty(4, 9, D, device="meta")),
         TypeError, "ln"),
        ("ln not contiguous", lambda: pool(ln.transpose(0, 1)), ValueError, "ln"),
        ("ln of the wrong width", lambda: pool(_rand(4, 9, 64)), ValueError, "ln"),
        ("ln of two axes", lambda: pool(_rand(4, D)), ValueError, "ln"),
        ("ln a list", lambda: pool([1.0, 2.0]), TypeError, "ln"),
        ("head of the wrong width", lambda: rg(c, _rand(4, H + 1)), ValueError, "head"),
        ("ctx float16", lambda: rg(c.half(), hd), TypeError, "ctx"),
        ("ctx of another batch", lambda: rg(_rand(3, H, D), hd), ValueError, "head"),
        ("labels requiring grad", lambda: loss(logits, labels.float().requires_grad_(True)),
         TypeError, "labels"),
        ("labels of the wrong shape", lambda: loss(logits, _labels(5)), ValueError, "labels"),
        ("logits of 20 atoms", lambda: loss(_rand(4, H, 20), labels), ValueError, "logits"),
        ("logits on the CPU", lambda: loss(logits.cpu(), labels), TypeError, "logits"),
        ("h_t of the wrong width", lambda: head(_rand(4, I + 1)), ValueError, "h_t"),
        ("h_t not contiguous", lambda: head(_rand(I, 4).T), ValueError, "h_t"),
        ("a module in float16", lambda: pht.AttentionPool(H, D, dtype=torch.float16),
         TypeError, "dtype"),
        ("an op id that names nothing", lambda: pht.pool_forward(pool.q_h, ln, 10 ** 6),
         ValueError, "op"),
        ("an op id of another op", lambda: pht.pool_forward(pool.q_h, ln, rg.op_id),
         ValueError, "op"),
        ("Adam at step 0", lambda: pht.adam_step(h_t, h_t, h_t, h_t, 0, adam),
         ValueError, "t"),
        ("Adam with a CPU grad", lambda: pht.adam_step(h_t, h_t.cpu(), h_t, h_t, 1, adam),
         TypeError, "grad"),
    ]


def test_bad_input_is_refused_by_name_before_any_launch(monkeypatch):
    from pycuda_heads.core.compile import DriverKernel
    cases = _bad_inputs()
    launches = []
    monkeypatch.setattr(DriverKernel, "launch_raw", lambda self, *a: launches.append(a))
    native_launches = native().launch_count()
    for what, call, error, name in cases:
        with pytest.raises(error, match=rf"\b{name}\b"):
            call()
        assert not launches and native().launch_count() == native_launches, what
    assert len(cases) >= 15


def test_module_calls_take_the_cpp_launcher():
    """On the GPU machine the C++ launcher is built, and a module call is its launches: the
    pool's forward one, its backward two (the kernel and the reduce of q_h's gradient)."""
    lib = native()
    assert lib is not None, "the C++ launcher was not built: see the warning"
    pool = pht.AttentionPool(5, 128)
    (ln,) = leaves((3, 33, 128))
    out, _ = pool(ln)  # the first call records the program
    torch.cuda.synchronize()
    before = lib.launch_count()
    out, attn = pool(ln)
    assert lib.launch_count() == before + 1
    out.sum().backward()
    torch.cuda.synchronize()
    assert lib.launch_count() > before + 1
    want_out, want_attn = reference_pool(pool.q_h, ln)
    assert close(out, want_out) and close(attn, want_attn)


def test_a_second_backward_through_a_module_raises_as_torch_does():
    """The C++ node frees what it saved after its backward, and a second backward through it
    gets torch's own error instead of a formula fed too few tensors."""
    pool = pht.AttentionPool(5, 128)
    (ln,) = leaves((3, 33, 128))
    out, _ = pool(ln)
    out.sum().backward()
    with pytest.raises(RuntimeError, match="second time"):
        out.sum().backward()
