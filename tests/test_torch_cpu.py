"""CPU: the bookkeeping of pycuda_heads.torch around its kernels (what the autograd Functions hand
the ops, and how launches are ordered on torch's streams), with the GPU parts replaced by fakes:
torch's CPU build runs these, so they need no device."""
import math
from contextlib import contextmanager

import pytest

torch = pytest.importorskip("torch")

import pycuda_heads.torch as pht  # noqa: E402  (needs torch)


class FakePool:
    """The pool's math in torch ops on the CPU; remembers what each backward call was given."""

    def __init__(self):
        self.calls = []

    def forward(self, q_h, ln, *, stream=None):
        attn = torch.softmax(q_h @ ln.transpose(1, 2) / math.sqrt(q_h.shape[1]), dim=-1)
        return attn @ ln, attn

    def backward(self, q_h, ln, attn, grad_ctx, *, grad_attn=None, ctx=None, stream=None):
        self.calls.append({"grad_ctx": grad_ctx, "grad_attn": grad_attn, "ctx": ctx})
        return torch.zeros_like(q_h), torch.zeros_like(ln)


@pytest.fixture
def no_device(monkeypatch):
    """The Functions' device calls as plain pass-throughs of CPU tensors."""
    @contextmanager
    def default_stream():
        yield None
    monkeypatch.setattr(pht, "torch_order", default_stream)
    monkeypatch.setattr(pht, "device_array", lambda t, name: t)
    monkeypatch.setattr(pht, "device_arrays", lambda **tensors: tuple(tensors.values()))
    monkeypatch.setattr(pht, "as_tensor", lambda arr: arr)


def pool_inputs():
    g = torch.Generator().manual_seed(0)
    q_h = torch.randn(5, 16, generator=g).requires_grad_(True)
    ln = torch.randn(3, 7, 16, generator=g).requires_grad_(True)
    return q_h, ln


def test_pool_backward_is_given_the_forwards_ctx(no_device):
    pool = FakePool()
    q_h, ln = pool_inputs()
    ctx, _ = pht.AttentionPoolFunction.apply(q_h, ln, pool)
    ctx.sum().backward()
    [call] = pool.calls
    assert call["ctx"] is not None and torch.equal(call["ctx"], ctx.detach())


def test_an_unused_attn_gets_no_zero_filled_gradient(no_device):
    pool = FakePool()
    q_h, ln = pool_inputs()
    ctx, _ = pht.AttentionPoolFunction.apply(q_h, ln, pool)
    ctx.sum().backward()
    [call] = pool.calls
    assert call["grad_attn"] is None and torch.equal(call["grad_ctx"], torch.ones_like(ctx))


def test_an_unused_ctx_gets_a_zero_gradient(no_device):
    pool = FakePool()
    q_h, ln = pool_inputs()
    _, attn = pht.AttentionPoolFunction.apply(q_h, ln, pool)
    g = torch.randn_like(attn)
    attn.backward(g)
    [call] = pool.calls
    assert torch.equal(call["grad_attn"], g)
    assert call["grad_ctx"].shape == (3, 5, 16) and not call["grad_ctx"].any()
    assert q_h.grad is not None and ln.grad is not None


class OnCuda1(torch.Tensor):
    """A CPU tensor that says it lives on cuda:1."""
    is_cuda = property(lambda self: True)
    device = property(lambda self: torch.device("cuda", 1))


def test_a_tensor_on_another_device_than_pycudas_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(pht, "_pycuda_device", lambda: 0)
    ln = torch.zeros(2, 3, 4).as_subclass(OnCuda1)
    with pytest.raises(ValueError, match=r"ln: expected a tensor on cuda:0.*got cuda:1"):
        pht.device_array(ln, "ln")


@pytest.fixture
def fake_streams(monkeypatch):
    """torch's current stream as a fake non-default stream, the side stream as a fake pair;
    returns a dict whose "capturing" says whether torch is capturing a graph."""
    from pycuda_heads.core.runtime import scope

    class Stream:
        cuda_stream = 7

        def wait_stream(self, other):
            pass

    state = {"capturing": False, "device": None}

    @contextmanager
    def device(index):
        state["device"] = index
        yield

    @contextmanager
    def no_context():
        yield
    monkeypatch.setattr(pht, "thread_context", no_context)
    monkeypatch.setattr(pht, "_pycuda_device", lambda: 0)
    monkeypatch.setattr(pht, "_side_stream", lambda: ("pycuda stream", Stream()))
    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state["capturing"])
    state["in_capture"] = lambda: scope().capturing
    return state


@pytest.mark.parametrize("capturing", [False, True])
def test_only_a_graph_capture_turns_the_launch_synchronisation_off(fake_streams, capturing):
    fake_streams["capturing"] = capturing
    with pht.torch_order() as s:
        assert s == "pycuda stream" and fake_streams["device"] == 0
        assert fake_streams["in_capture"]() is capturing  # PYCUDA_HEADS_SYNC=1 holds otherwise
    assert not fake_streams["in_capture"]()
