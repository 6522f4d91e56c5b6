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
