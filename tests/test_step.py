"""GPU: the composed head step, eager and replayed as a CUDA graph, against the ops called one by
one and the float64 references. CPU: its order of launches, synchronisations and capture, and
what it hands the ops, with the ops, stream and graph faked."""
import numpy as np
import pytest

import pycuda_heads as ph
from pycuda_heads import reference as ref
from pycuda_heads import step as step_module

F32 = np.float32


def fill(step, seed):
    rng = np.random.default_rng(seed)
    x = {name: rng.standard_normal(arr.shape).astype(F32) for name, arr in step.inputs.items()}
    x["alpha"] = rng.uniform(-1, 1, x["alpha"].shape).astype(F32)
    for name, arr in step.inputs.items():
        arr.set(x[name])
    return x


def host(outputs):
    return {name: arr.get() for name, arr in outputs.items()}


def expected(x):
    ctx, attn = ref.pool_forward(x["q_h"], x["ln"])
    residual = ref.residual_forward(ctx, x["w_res"], x["bias_res"])
    out = ref.gate_forward(x["head"], residual, x["alpha"])
    _, grad_residual, grad_alpha = ref.gate_backward(residual, x["alpha"], x["grad_out"])
    grad_w_res, grad_bias_res, grad_ctx = ref.residual_backward(ctx, x["w_res"], grad_residual)
    grad_q_h, grad_ln = ref.pool_backward(x["q_h"], x["ln"], attn, grad_ctx)
    return {"ctx": ctx, "attn": attn, "residual": residual, "out": out,
            "grad_alpha": grad_alpha, "grad_w_res": grad_w_res,
            "grad_bias_res": grad_bias_res, "grad_ctx": grad_ctx, "grad_q_h": grad_q_h,
            "grad_ln": grad_ln}


@pytest.mark.gpu
@pytest.mark.parametrize("b,k", [(2, 8), (3, 33), (256, 64)])
def test_step_matches_the_references_and_the_ops_called_one_by_one(b, k):
    step = ph.HeadStep(5, 128, b, k)
    x = fill(step, b)
    got = host(step.run())
    step.synchronize()
    for name, want in expected(x).items():
        scale = np.abs(want).max() + 1e-30
        assert np.abs(got[name] - want).max() / scale < 1e-4, name
    assert got["grad_head"].tobytes() == x["grad_out"].tobytes()
    # the same kernels and launch parameters as the ops themselves: bitwise the same numbers
    ctx, attn = step.pool.forward(x["q_h"], x["ln"])
    assert ctx.get().tobytes() == got["ctx"].tobytes()
    assert attn.get().tobytes() == got["attn"].tobytes()
    # the pool's backward is given the forward's ctx (the path that reads ln once fewer)
    grad_q_h, grad_ln = step.pool.backward(x["q_h"], x["ln"], attn, got["grad_ctx"], ctx=ctx)
    assert grad_q_h.get().tobytes() == got["grad_q_h"].tobytes()
    assert grad_ln.get().tobytes() == got["grad_ln"].tobytes()


@pytest.mark.gpu
def test_graph_replay_is_bitwise_the_eager_step_and_reads_the_current_inputs():
    step = ph.HeadStep(5, 128, 4, 16)
    fill(step, 1)
    eager = host(step.run())
    replayed = host(step.replay())
    step.synchronize()
    assert {n: a.tobytes() for n, a in eager.items()} == \
        {n: a.tobytes() for n, a in replayed.items()}
    x = fill(step, 2)  # new data in the same buffers: the graph sees it
    again = host(step.replay())
    want = expected(x)
    assert np.abs(again["grad_ln"] - want["grad_ln"]).max() < 1e-4 * np.abs(want["grad_ln"]).max()
    assert np.abs(again["out"] - want["out"]).max() < 1e-4 * np.abs(want["out"]).max()


@pytest.mark.gpu
def test_replay_before_any_run_is_bitwise_an_eager_step():
    fresh, eager_step = ph.HeadStep(5, 128, 4, 16), ph.HeadStep(5, 128, 4, 16)
    fill(fresh, 4)
    fill(eager_step, 4)
    replayed = host(fresh.replay())  # captured after a first eager step that it did not wait for
    eager = host(eager_step.run())
    fresh.synchronize()
    eager_step.synchronize()
    assert {n: a.tobytes() for n, a in eager.items()} == \
        {n: a.tobytes() for n, a in replayed.items()}


@pytest.mark.gpu
def test_step_runs_on_the_callers_stream_and_owns_fixed_buffers():
    from pycuda_heads.core.device import cuda
    stream = cuda().Stream()
    step = ph.HeadStep(5, 128, 2, 8, stream=stream)
    fill(step, 3)
    first = {n: int(a.gpudata) for n, a in step.run().items()}
    second = {n: int(a.gpudata) for n, a in step.run().items()}
    stream.synchronize()
    assert first == second and step.stream is stream
    assert set(step.inputs) == {"q_h", "ln", "w_res", "bias_res", "head", "alpha", "grad_out"}


def test_bad_step_arguments_raise():
    with pytest.raises(ValueError, match="batch must be a positive int"):
        ph.HeadStep(5, 128, 0, 8)
    with pytest.raises(ValueError, match="unknown ops"):
        ph.HeadStep(5, 128, 2, 8, launch={"frd": {}})


# --- CPU: the step's bookkeeping, with fakes ---------------------------------------------------

class FakeStream:
    def __init__(self, events):
        self.events = events

    def synchronize(self):
        self.events.append("sync")


class FakeArena:
    def __init__(self, events):
        self.events, self.measuring = events, True

    def reserve(self):
        self.measuring = False
        self.events.append("reserve")


def bare_step(monkeypatch):
    """A HeadStep whose launches, stream, buffers and graph only log what happens to them."""
    events = []
    step = object.__new__(ph.HeadStep)
    step.stream, step._arena, step.outputs, step._graph = (
        FakeStream(events), FakeArena(events), {}, None)
    step._launch = lambda s: events.append("launch") or {"out": len(events)}
    monkeypatch.setattr(step_module, "Graph",
                        lambda record, s: events.append("capture") or record(s))
    return step, events


def test_the_first_run_launches_twice_and_synchronises_once(monkeypatch):
    step, events = bare_step(monkeypatch)
    step.run()
    assert events == ["launch", "sync", "reserve", "launch"]
    step.run()
    assert events[4:] == ["launch"]


def test_capture_after_the_first_run_synchronises_no_more(monkeypatch):
    step, events = bare_step(monkeypatch)
    step.capture()
    assert events == ["launch", "sync", "reserve", "launch", "capture", "launch"]


def test_the_pool_backward_is_given_the_forwards_ctx():
    calls = []

    class Pool:
        def forward(self, q_h, ln, *, stream=None):
            return "ctx", "attn"

        def backward(self, q_h, ln, attn, grad_ctx, *, grad_attn=None, ctx=None, stream=None):
            calls.append({"attn": attn, "grad_ctx": grad_ctx, "ctx": ctx, "stream": stream})
            return "grad_q_h", "grad_ln"

    class ResGate:
        def forward(self, ctx, w_res, bias_res, head, alpha, *, stream=None):
            return "out", "residual"

        def backward(self, ctx, w_res, alpha, residual, grad_out, *, stream=None):
            return "grad_w_res", "grad_bias_res", "grad_ctx", "grad_head", "grad_alpha"

    step = object.__new__(ph.HeadStep)
    step.pool, step.resgate = Pool(), ResGate()
    step.inputs = {name: name for name in step_module.INPUTS}
    out = step._launch("s")
    assert calls == [{"attn": "attn", "grad_ctx": "grad_ctx", "ctx": "ctx", "stream": "s"}]
    assert out["grad_ln"] == "grad_ln" and out["ctx"] == "ctx"
