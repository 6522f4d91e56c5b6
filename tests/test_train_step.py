"""The whole training step (``TrainStep``). GPU: the eager step against the float64 references
and per-array Adam on its own gradients, the CUDA graph bitwise the eager step over several
steps and shapes (an odd B among them), capturing changes no state, a failed capture leaves the
eager path working, bad input raises before any launch. CPU: the input checks, with the step's
buffers faked."""
import numpy as np
import pytest

import pycuda_heads as ph
from pycuda_heads import reference as ref
from pycuda_heads import step as step_module
from pycuda_heads.ops.headloss import FRD_WEIGHT

H, D, F, A = 5, 128, 128, 21
LR = 3e-3


def params(seed=0):
    rng = np.random.default_rng([seed, 0])
    shapes = {n: tuple({"H": H, "D": D, "F": F, "A": A}[a] for a in axes)
              for n, axes in step_module.PARAMS.items()}
    out = {n: (rng.standard_normal(s) / np.sqrt(s[-1] if len(s) > 1 else 1)).astype(np.float32)
           for n, s in shapes.items()}
    out["alpha"] = rng.uniform(-1, 1, H).astype(np.float32)  # an open gate
    return out


def data(b, k, seed):
    rng = np.random.default_rng([seed, 1])
    ln = rng.standard_normal((b, k, D), dtype=np.float32)
    labels = rng.integers(0, A, (b, H)).astype(np.int32)
    labels[-1, 1:] = -1  # horizons not realised yet
    return {"ln": ln, "h_t": np.ascontiguousarray(ln[:, -1]),
            "base": rng.standard_normal((b, H), dtype=np.float32),
            "y": rng.standard_normal((b, H), dtype=np.float32), "labels": labels}


def make(b, k, seed=0):
    step = ph.TrainStep(H, D, b, k, frd_hidden=F, n_atoms=A, lr=LR)
    step.load(params(seed))
    return step


def host(arrays):
    return {n: a.get() for n, a in arrays.items()}


def expected(p, x):
    """The float64 loss and gradients of one step of the model."""
    ctx, attn = ref.pool_forward(p["q_h"], x["ln"])
    residual = ref.residual_forward(ctx, p["w_res"], p["bias_res"])
    out = ref.gate_forward(x["base"], residual, p["alpha"])
    hidden, logits = ref.frdhead_forward(x["h_t"], p["w1"], p["b1"], p["w2"], p["b2"])
    grad_logits, ce = ref.frd_softmax_ce_grad(logits, x["labels"])
    b = out.shape[0]
    d = out - x["y"]
    loss = np.mean(d * d) + FRD_WEIGHT * ce.sum() / b
    _, grad_residual, g_alpha = ref.gate_backward(residual, p["alpha"], d * (2 / d.size))
    g_wres, g_bres, grad_ctx = ref.residual_backward(ctx, p["w_res"], grad_residual)
    g_q, _ = ref.pool_backward(p["q_h"], x["ln"], attn, grad_ctx)
    g_w2, g_b2, dhidden = ref.frdhead_grad_w2(hidden, p["w2"], FRD_WEIGHT * grad_logits)
    g_w1, g_b1, _ = ref.frdhead_grad_w1(x["h_t"], p["w1"], hidden, dhidden)
    return loss, {"q_h": g_q, "w_res": g_wres, "bias_res": g_bres, "alpha": g_alpha,
                  "w1": g_w1, "b1": g_b1, "w2": g_w2, "b2": g_b2}


@pytest.mark.gpu
@pytest.mark.parametrize("b,k", [(2, 8), (3, 33), (256, 64), (1100, 4)])
def test_an_eager_step_matches_float64_and_per_array_adam_on_its_gradients(b, k):
    step, p, x = make(b, k), params(), data(b, k, 1)
    assert type(step.head) is (ph.FrdHeadSmall if b <= step_module.SMALL_BATCH else ph.FrdHead)
    step.feed(**x)
    loss = step.run()
    step.synchronize()
    want_loss, want_grads = expected(p, x)
    assert abs(float(loss.get()[0]) - want_loss) <= 1e-4 * abs(want_loss)
    adam = ph.Adam(lr=LR)
    after = host(step.params)
    for name, want in want_grads.items():
        got = step.outputs[f"grad_{name}"].get()
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), name
        stepped = adam.step(p[name], got, np.zeros_like(got), np.zeros_like(got), 1)[0].get()
        assert after[name].tobytes() == stepped.tobytes(), name
    assert step.t == 1


@pytest.mark.gpu
# B=9000: on the H200 the tuned table runs the FRD head's WGMMA forward_loss there (two launches)
@pytest.mark.parametrize("b,k", [(2, 8), (3, 33), (256, 64), (1100, 4), (9000, 4)])
def test_graph_replays_are_bitwise_the_eager_steps(b, k):
    eager, graph = make(b, k), make(b, k)
    for s in range(4):
        x = data(b, k, 10 + s)
        eager.feed(**x)
        graph.feed(**x)
        losses = [eager.run().get().tobytes(), graph.replay().get().tobytes()]
        assert losses[0] == losses[1], s
    assert {n: a.tobytes() for n, a in host(eager.params).items()} == \
        {n: a.tobytes() for n, a in host(graph.params).items()}
    assert {n: a.get().tobytes() for n, a in eager.m.items()} == \
        {n: a.get().tobytes() for n, a in graph.m.items()}
    assert eager.t == graph.t == 4


@pytest.mark.gpu
@pytest.mark.parametrize("cls,b", [(ph.FrdHeadSmall, 2), (ph.FrdHeadSmall, 300),
                                   (ph.FrdHead, 2), (ph.FrdHead, 1100), (ph.FrdHead, 9000)])
def test_the_fused_forward_and_loss_is_the_two_launches_it_replaces(cls, b):
    """forward_loss of either head (one block, several) against forward and FrdSoftmaxCE, with
    -1 labels: the forward bitwise, the softmax-CE gradient and ce within float32 rounding."""
    p, x = params(), data(b, 4, 7)
    x["labels"][0] = -1
    head = cls(D, F, H, A)
    weights = [p[n] for n in ("w1", "b1", "w2", "b2")]
    fused = [a.get() for a in head.forward_loss(x["h_t"], *weights, x["labels"])]
    hidden, logits = head.forward(x["h_t"], *weights)
    grad, ce = ph.FrdSoftmaxCE(H, A).softmax_ce_grad(logits, x["labels"])
    unfused = [a.get() for a in (hidden, logits, grad, ce)]
    for name, got, want in zip(("hidden", "logits", "grad_logits", "ce"), fused, unfused):
        if name in ("hidden", "logits"):
            assert got.tobytes() == want.tobytes(), name
        else:
            assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), name
    assert (fused[2][0] == 0).all() and (fused[3][0] == 0).all()


@pytest.mark.gpu
def test_capturing_changes_no_state_and_a_replay_reads_no_host_argument():
    step, x = make(4, 16), data(4, 16, 3)
    step.feed(**x)
    before = {n: a.tobytes() for n, a in host(step.params).items()}
    step.capture()
    step.synchronize()
    assert {n: a.tobytes() for n, a in host(step.params).items()} == before and step.t == 0
    twin = make(4, 16)
    twin.feed(**x)
    for _ in range(3):  # the same inputs: only the device counter and the parameters move
        assert step.replay().get().tobytes() == twin.run().get().tobytes()
    assert step.t == 3


@pytest.mark.gpu
def test_a_failed_capture_raises_and_leaves_the_eager_path_working(monkeypatch):
    step, twin, x = make(3, 8), make(3, 8), data(3, 8, 4)
    for s in (step, twin):
        s.feed(**x)
        s.run()
    real = step.head.forward_loss

    def failing(*args, **kwargs):
        raise RuntimeError("recording failed on purpose")
    monkeypatch.setattr(step.head, "forward_loss", failing)
    with pytest.raises(RuntimeError, match="on purpose"):
        step.capture()
    monkeypatch.setattr(step.head, "forward_loss", real)
    assert step._graph is None
    assert step.run().get().tobytes() == twin.run().get().tobytes()
    assert step.replay().get().tobytes() == twin.run().get().tobytes()  # capture works again
    assert step.t == twin.t == 3


@pytest.mark.gpu
def test_bad_input_raises_before_any_launch():
    from pycuda_heads.core.compile import recorded_launches
    step, x = make(2, 8), data(2, 8, 5)
    step.feed(**x)
    wrong = {"ln": (np.ones((2, 9, D), np.float32), ValueError, r"ln: expected shape"),
             "labels": (x["labels"].astype(np.float32), TypeError, "labels: expected dtype int32"),
             "y": ([[0.0] * H] * 2, TypeError, "y: expected a NumPy array"),
             "base": (np.ones((2, H), np.float64), TypeError, "base: expected dtype float32")}
    with recorded_launches() as launches:
        for name, (value, error, match) in wrong.items():
            with pytest.raises(error, match=match):
                step.feed(**{**x, name: value})
        bad = x["labels"].copy()
        bad[1, 2] = A
        with pytest.raises(ValueError, match=r"labels\[1, 2\] = 21 is outside"):
            step.feed(labels=bad)
        with pytest.raises(ValueError, match="unknown data"):
            step.feed(grad_out=x["y"])
        with pytest.raises(ValueError, match=r"params lacks \['b2'\]"):
            step.load({n: v for n, v in params().items() if n != "b2"})
    assert launches == []
    assert host(step.inputs)["ln"].tobytes() == x["ln"].tobytes()
    with pytest.raises(RuntimeError, match="load"):
        ph.TrainStep(H, D, 2, 8).run()


def test_bad_step_arguments_raise():
    with pytest.raises(ValueError, match="TrainStep: batch must be a positive int"):
        ph.TrainStep(H, D, 0, 8)
    with pytest.raises(ValueError, match="unknown ops"):
        ph.TrainStep(H, D, 2, 8, launch={"adam": {}})


# --- CPU: the input checks, with the step's buffers faked -----------------------------------------

class Buffer:
    def __init__(self):
        self.copies = 0

    def set(self, value):
        self.copies += 1


def bare_step():
    step = object.__new__(ph.TrainStep)
    step.dims = {"B": 2, "K": 8, "H": H, "D": D, "F": F, "A": A}
    step.inputs = {n: Buffer() for n in step_module.DATA}
    step.params = {n: Buffer() for n in step_module.PARAMS}
    return step


def test_every_array_is_checked_before_any_is_copied():
    step, x = bare_step(), data(2, 8, 6)
    with pytest.raises(ValueError, match=r"y: expected shape \(B, H\) = \(2, 5\)"):
        step._put({**x, "y": np.ones((3, H), np.float32)}, step_module.DATA, step.inputs, "data")
    with pytest.raises(TypeError, match="labels: expected dtype int32"):
        step._put({**x, "labels": x["labels"].astype(np.int64)}, step_module.DATA, step.inputs,
                  "data")
    assert all(b.copies == 0 for b in step.inputs.values())
    step._put(x, step_module.DATA, step.inputs, "data")
    assert all(b.copies == 1 for b in step.inputs.values())


def test_parameters_are_checked_by_name_and_shape():
    step, p = bare_step(), params()
    with pytest.raises(ValueError, match=r"unknown params \['w3'\]"):
        step._put({**p, "w3": p["w1"]}, step_module.PARAMS, step.params, "params")
    with pytest.raises(ValueError, match=r"w2: expected shape \(H, A, F\)"):
        step._put({**p, "w2": p["w2"][:, :20]}, step_module.PARAMS, step.params, "params")
    assert all(b.copies == 0 for b in step.params.values())


def test_the_benchs_torch_model_is_the_steps_model():
    """The plain-torch peer of the train_step bench (on the CPU): the float64 loss and
    gradients of the step."""
    torch = pytest.importorskip("torch")
    from pycuda_heads.perf import train_bench
    p, x = train_bench.model({"B": 3, "K": 8})
    loss_fn, leaves = train_bench.torch_model(torch, {n: v.astype(np.float64) for n, v in
                                                      p.items()}, device="cpu")
    loss = loss_fn(*(torch.from_numpy(x[n] if n == "labels" else x[n].astype(np.float64))
                     for n in ("ln", "h_t", "base", "y", "labels")))
    loss.backward()
    want_loss, want_grads = expected(p, x)
    assert loss.item() == pytest.approx(want_loss, rel=1e-5)
    for name, leaf in zip(step_module.PARAMS, leaves):
        want = want_grads[name]
        assert np.abs(leaf.grad.numpy() - want).max() <= 1e-5 * np.abs(want).max(), name
