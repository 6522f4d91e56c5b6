"""CPU: pycuda_heads.torch's registration, compile path and modules, with torch's CPU build.

The operators' CPU kernels refuse every tensor by name (the kernels run on the GPU). Here a
fixture registers the kernels' declared torch peers as CPU kernels instead, so that
``torch.library.opcheck`` and ``torch.compile`` test the schemas, fake implementations and
autograd formulas for real; a fake device lets the op objects be made without PyCUDA. The
launch programs are checked against the op methods' own launches, recorded dry."""
import contextlib
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pycuda_heads.torch as pht  # noqa: E402  (needs torch)
from pycuda_heads.core import device as core_device  # noqa: E402
from pycuda_heads.core import program as core_program  # noqa: E402
from pycuda_heads.core.compile import Kernel  # noqa: E402
from pycuda_heads.ops import frd, frdhead, pool, resgate  # noqa: E402
from pycuda_heads.ops.adam import Adam, torch_step  # noqa: E402
from pycuda_heads.perf import torch_train  # noqa: E402
from pycuda_heads.torch import ops as tops  # noqa: E402

from fakes import fake_gpu  # noqa: E402,F401  (a fixture)


@pytest.fixture
def fake_device(fake_gpu, monkeypatch):
    """Op objects made, and their programs recorded, with PyCUDA faked; a program's kernels
    are the op's own (they stand in for the raw-launch ones)."""
    monkeypatch.setattr(core_device, "sm_count", lambda: 132)
    monkeypatch.setattr(core_program, "thread_context", contextlib.nullcontext)
    monkeypatch.setattr(core_program, "bind_primary_context", lambda: None)
    monkeypatch.setattr(core_program, "on_any_stream", lambda kernel: kernel)
    monkeypatch.setattr(Kernel, "opt_in", lambda self, shared: None)


# ---- the peers as CPU kernels ----

def _pool_backward_cpu(q_h, ln, attn, grad_ctx, ctx, grad_attn, op):
    scale = 1.0 / math.sqrt(q_h.shape[1])
    dw = grad_ctx @ ln.transpose(1, 2) + (0 if grad_attn is None else grad_attn)
    ds = attn * (dw - (attn * dw).sum(-1, keepdim=True))
    return (scale * torch.einsum("bhk,bkd->hd", ds, ln),
            attn.transpose(1, 2) @ grad_ctx + scale * ds.transpose(1, 2) @ q_h)


def _resgate_backward_cpu(c, w_res, alpha, residual, grad_out, op):
    gw, gb, gc, _, ga = resgate.torch_backward(torch, c, w_res, alpha, residual, grad_out)
    return gc, torch.cat([gw.reshape(-1), gb, ga])


def _grad_row(fn):
    def kernel(*args):
        gw, gb, other = fn(torch, *args[:-1])
        return torch.cat([gw.reshape(-1), gb.reshape(-1)]), other
    return kernel


def _backward_rows(gw1, gb1, gw2, gb2, gh):
    return (torch.cat([gw1.reshape(-1), gb1.reshape(-1)]),
            torch.cat([gw2.reshape(-1), gb2.reshape(-1)]), gh)


def _adam_cpu(param, grad, m, v, t, op):
    new = torch_step(torch, param, grad, m, v, t)
    for dst, src in zip((param, m, v), new):
        dst.copy_(src)


CPU_KERNELS = {
    "pool_forward": lambda q_h, ln, op: pool.torch_forward(torch, q_h, ln),
    "pool_backward": _pool_backward_cpu,
    "resgate_forward": lambda *a: resgate.torch_forward(torch, *a[:-1]),
    "resgate_backward": _resgate_backward_cpu,
    "frd_softmax_ce": lambda logits, labels, op: frd.torch_softmax_ce_grad(torch, logits, labels),
    "frdhead_forward": lambda *a: frdhead.torch_forward(torch, *a[:-1]),
    "frdhead_forward_loss": lambda *a: frdhead.torch_forward_loss(torch, *a[:-1]),
    "frdhead_grad_w2": _grad_row(frdhead.torch_grad_w2),
    "frdhead_grad_w1": _grad_row(frdhead.torch_grad_w1),
    "frdhead_backward": lambda *a: _backward_rows(*frdhead.torch_backward(torch, *a[:-1])),
    "adam_step": _adam_cpu,
}


def _contiguous(fn):
    """The kernels write C-contiguous outputs; so must their stand-ins."""
    def kernel(*args):
        out = fn(*args)
        return out if out is None else tuple(t.contiguous() for t in out)
    return kernel


@pytest.fixture
def cpu_kernels():
    """The peers as the operators' CPU kernels for the test; the refusing ones after it."""
    assert set(CPU_KERNELS) == set(tops.DEFINITIONS)
    originals = {name: d._backend_fns["cpu"] for name, d in tops.DEFINITIONS.items()}
    for name, fn in CPU_KERNELS.items():
        tops.DEFINITIONS[name].register_kernel("cpu", _contiguous(fn))
    yield
    for name, fn in originals.items():
        tops.DEFINITIONS[name].register_kernel("cpu", fn)


H, D, A, F, I = 5, 16, 21, 12, 10


def _cases(b, k):
    """name -> tensor arguments of each operator (the differentiable inputs of the forward
    ones requiring grad)."""
    g = torch.Generator().manual_seed(b * 100 + k)
    r = lambda *s, grad=False: torch.randn(*s, generator=g).requires_grad_(grad)  # noqa: E731
    attn = torch.softmax(r(b, H, k), -1)
    labels = torch.randint(-1, A, (b, H), generator=g, dtype=torch.int32)
    hidden = torch.relu(r(b, F))
    return {
        "pool_forward": [r(H, D, grad=True), r(b, k, D, grad=True)],
        "pool_backward": [r(H, D), r(b, k, D), attn, r(b, H, D), r(b, H, D), r(b, H, k)],
        "resgate_forward": [r(b, H, D, grad=True), r(H, D, grad=True), r(H, grad=True),
                            r(b, H, grad=True), r(H, grad=True)],
        "resgate_backward": [r(b, H, D), r(H, D), r(H), r(b, H), r(b, H)],
        "frd_softmax_ce": [r(b, H, A, grad=True), labels],
        "frdhead_forward": [r(b, I, grad=True), r(F, I, grad=True), r(F, grad=True),
                            r(H, A, F, grad=True), r(H, A, grad=True)],
        "frdhead_forward_loss": [r(b, I, grad=True), r(F, I, grad=True), r(F, grad=True),
                                 r(H, A, F, grad=True), r(H, A, grad=True), labels],
        "frdhead_grad_w2": [hidden, r(H, A, F), r(b, H, A)],
        "frdhead_grad_w1": [r(b, I), r(F, I), hidden, r(b, F)],
        "frdhead_backward": [r(b, I), r(F, I), r(H, A, F), hidden, r(b, H, A)],
        "adam_step": [r(50), r(50), r(50), r(50).abs(), 3],
    }


@pytest.mark.parametrize("b,k", [(1, 1), (3, 7), (16, 33)])
def test_opcheck_passes_for_every_operator_on_its_cpu_kernel(cpu_kernels, b, k):
    for name, args in _cases(b, k).items():
        torch.library.opcheck(getattr(torch.ops.pycuda_heads, name), (*args, 0))


def test_each_operator_refuses_a_cpu_tensor_by_name(fake_device):
    ids = {"PerHorizonAttentionPool": pht.register(pool.PerHorizonAttentionPool(H, D)),
           "ResidualGate": pht.register(resgate.ResidualGate(H, D)),
           "FrdSoftmaxCE": pht.register(frd.FrdSoftmaxCE(H, A)),
           "FrdHead": pht.register(frdhead.FrdHead(I, F, H, A)), "Adam": pht.register(Adam())}
    for name, args in _cases(2, 3).items():
        spec = tops._SPECS.get(name)
        op, first = (ids[spec.kind], spec.names[0]) if spec else (ids["Adam"], "param")
        with pytest.raises(TypeError, match=rf"^{first}: expected a CUDA tensor"):
            getattr(torch.ops.pycuda_heads, name)(*args, op)


# ---- modules ----

@pytest.fixture
def modules(fake_device):
    return {"pool": pht.AttentionPool(H, D, device="cpu"),
            "gate": pht.ResidualGate(H, D, device="cpu"),
            "head": pht.FrdHead(I, F, H, A, device="cpu"), "loss": pht.FrdLoss(H, A)}


def test_modules_take_factory_arguments_and_refuse_other_dtypes(fake_device, modules):
    assert all(p.device.type == "cpu" and p.dtype == torch.float32
               for m in modules.values() for p in m.parameters())
    for make in (lambda **kw: pht.AttentionPool(H, D, **kw),
                 lambda **kw: pht.ResidualGate(H, D, **kw),
                 lambda **kw: pht.FrdHead(I, F, H, A, **kw)):
        assert make(device="cpu", dtype=torch.float32)
        with pytest.raises(TypeError, match="^dtype: the kernels run float32 only"):
            make(device="cpu", dtype=torch.bfloat16)


def test_modules_of_one_configuration_share_one_registered_op(fake_device):
    from pycuda_heads.torch import ops
    first = pht.AttentionPool(H, D, device="cpu")
    registered = len(ops._ops)
    again = [pht.AttentionPool(H, D, device="cpu") for _ in range(10)]
    assert len(ops._ops) == registered and {m.op_id for m in again} == {first.op_id}
    assert all(m.op is first.op for m in again)
    launch = {"forward": {"BLOCK": 128}}
    tuned = [pht.AttentionPool(H, D, launch=launch, device="cpu") for _ in range(2)]
    assert tuned[0].op_id == tuned[1].op_id != first.op_id
    assert pht.AttentionPool(H + 1, D, device="cpu").op_id not in (first.op_id, tuned[0].op_id)
    with pytest.raises(TypeError, match="launch= must map kernel roles"):
        pht.AttentionPool(H, D, launch=[("forward", {})], device="cpu")


def test_the_head_runs_the_small_batch_op_where_the_step_does(fake_device):
    from pycuda_heads.ops.frdsmall import FrdHeadSmall
    from pycuda_heads.step import SMALL_BATCH
    head = pht.FrdHead(I, F, H, A, device="cpu")
    small, large = head.op_id_for(SMALL_BATCH), head.op_id_for(SMALL_BATCH + 1)
    assert type(tops._ops[small]) is FrdHeadSmall and large == head.op_id != small
    assert type(tops._ops[large]) is frdhead.FrdHead
    assert tops._op(small, "FrdHead") is tops._ops[small]  # its operators take it as a FrdHead
    pinned = pht.FrdHead(I, F, H, A, launch={"forward": {"BM": 32}}, device="cpu")
    assert pinned.op_id_for(1) == pinned.op_id  # a launch= names FrdHead's own kernels
    wide = pht.FrdHead(I, 2048, H, A, device="cpu")
    assert wide.op_id_for(1) == wide.op_id  # past FrdHeadSmall's sizes


def test_reset_parameters_opens_nothing_and_scales_the_weights(modules):
    gate = modules["gate"]
    with torch.no_grad():
        for p in gate.parameters():
            p.fill_(7.0)
    gate.reset_parameters()
    assert torch.equal(gate.alpha, torch.zeros(H)) and torch.equal(gate.bias_res, torch.zeros(H))
    big = pht.AttentionPool(32, 1024, device="cpu")
    assert abs(float(big.q_h.detach().std()) - 1 / math.sqrt(1024)) < 0.1 / math.sqrt(1024)


def test_state_dict_round_trips(modules):
    for name, module in modules.items():
        state = module.state_dict()
        assert set(state) == {n for n, _ in module.named_parameters()}, name
        twin = type(module)(*_args(module), device="cpu") if name != "loss" else \
            type(module)(H, A)
        twin.load_state_dict(state)
        assert all(torch.equal(a, b) for a, b in zip(twin.state_dict().values(),
                                                      state.values()))


def _args(module):
    if isinstance(module, pht.FrdHead):
        return module.d_in, module.hidden, module.n_horizons, module.n_atoms
    return module.n_horizons, module.hidden_dim


def test_modules_on_the_cpu_kernels_match_the_peers(cpu_kernels, modules):
    pool_m, gate, head, loss = (modules[k] for k in ("pool", "gate", "head", "loss"))
    with torch.no_grad():
        gate.alpha.uniform_(-1, 1)
    ln = torch.randn(3, 7, D, requires_grad=True)
    ctx, _ = pool_m(ln)
    out = gate(ctx, torch.zeros(3, H))
    ctx2, _ = pool.torch_forward(torch, pool_m.q_h, ln)
    out2, _ = resgate.torch_forward(torch, ctx2, gate.w_res, gate.bias_res, torch.zeros(3, H),
                                    gate.alpha)
    params = [ln, pool_m.q_h, *gate.parameters()]
    for a, b in zip(torch.autograd.grad(out.sum(), params),
                    torch.autograd.grad(out2.sum(), params)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    h_t = torch.randn(4, I)
    labels = torch.tensor([[0, -1, 3, 20, 5]] * 4)  # int64: converted
    got = loss(head(h_t), labels)
    _, logits = frdhead.torch_forward(torch, h_t, head.w1, head.b1, head.w2, head.b2)
    want = torch.nn.functional.cross_entropy(logits.reshape(-1, A), labels.reshape(-1),
                                             ignore_index=-1, reduction="sum") / 4
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(torch.autograd.grad(got, list(head.parameters())),
                    torch.autograd.grad(want, list(head.parameters()))):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_heads_fused_loss_is_its_logits_through_frd_loss(cpu_kernels, modules):
    """FrdHead.forward_loss: the logits and loss of FrdHead then FrdLoss, and their gradients,
    also where the logits reach the loss beside it."""
    head, loss = modules["head"], modules["loss"]
    h_t = torch.randn(4, I, requires_grad=True)
    labels = torch.tensor([[0, -1, 3, 20, 5]] * 4)  # int64: converted
    logits, fused = head.forward_loss(h_t, labels)
    want_logits = head(h_t)
    want = loss(want_logits, labels)
    torch.testing.assert_close(logits, want_logits)
    torch.testing.assert_close(fused, want, rtol=1e-6, atol=1e-7)
    params = [h_t, *head.parameters()]
    for total, want_total in ((fused, want), (fused + logits.square().mean(),
                                              want + want_logits.square().mean())):
        for a, b in zip(torch.autograd.grad(total, params, retain_graph=True),
                        torch.autograd.grad(want_total, params, retain_graph=True)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="^labels: .* got torch.float32"):
        head.forward_loss(h_t, torch.zeros(4, H))


def test_frd_loss_refuses_labels_that_are_no_class_indices(modules):
    logits = torch.randn(2, H, A)
    with pytest.raises(TypeError, match="^labels: .* got torch.float32 that requires grad"):
        modules["loss"](logits, torch.zeros(2, H, requires_grad=True))
    with pytest.raises(TypeError, match="^labels: .* got list"):
        modules["loss"](logits, [[0] * H] * 2)


# ---- torch.compile ----

@pytest.mark.parametrize("model", torch_train.MODELS)
def test_both_bench_models_compile_fullgraph_with_no_graph_break(fake_device, cpu_kernels,
                                                                  model):
    library, plain, params, _ = torch_train.models(torch, model, "cpu")
    inputs = torch_train.batch(torch, model, {"B": 8, "K": 16}, "cpu")
    explained = torch._dynamo.explain(library)(*inputs)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    eager = library(*inputs)
    want = torch.autograd.grad(eager, params)
    torch._dynamo.reset()
    compiled = torch.compile(library, fullgraph=True, backend="aot_eager")
    got_loss = compiled(*inputs)
    torch.testing.assert_close(got_loss, eager, rtol=1e-5, atol=0)
    for a, b in zip(torch.autograd.grad(got_loss, params), want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(plain(*inputs), eager, rtol=1e-5, atol=1e-6)


# ---- launch programs ----

def _program(op, name, shapes, dtypes=None):
    spec = tops._SPECS[name]
    inputs = [None if s is None else core_program.ArraySpec(
        s, np.dtype(np.int32) if (dtypes or {}).get(n) else np.dtype(np.float32))
        for n, s in zip(spec.names, shapes)]
    return core_program.record(lambda arrays: spec.call(op, arrays), inputs, spec.outputs)


@pytest.mark.parametrize("b", [3, 65536])
def test_a_resgate_backward_program_hands_back_grad_ctx_and_one_gradient_row(fake_device, b):
    op = resgate.ResidualGate(H, D)
    program = _program(op, "resgate_backward", [(b, H, D), (H, D), (H,), (b, H), (b, H)])
    assert program.outputs == [((b, H, D), np.float32), ((H * D + 2 * H,), np.float32)]
    first = program.launches[0]
    kinds = {op_kernel_param: (kind, index) for op_kernel_param, (at, kind, index, _) in
             zip([n for n, t in zip(first.kernel.params, first.kernel.types) if t == "P"],
                 first.pointers)}
    assert kinds["grad_ctx"] == (core_program.OUTPUT, 0)
    assert kinds["ctx"] == (core_program.INPUT, 0) and kinds["grad_out"] == \
        (core_program.INPUT, 4)
    if len(program.launches) == 1:  # one row group: the kernel writes the row itself
        assert kinds["scratch"] == (core_program.OUTPUT, 1) and program.scratch_bytes == 0
    else:  # row groups in scratch, the reduce writes the row
        assert kinds["scratch"] == (core_program.SCRATCH, 0) and program.scratch_bytes > 0
        reduce = program.launches[-1]
        assert [p[1:3] for p in reduce.pointers] == [(core_program.SCRATCH, 0),
                                                     (core_program.OUTPUT, 1)]


def test_a_program_keeps_absent_inputs_null_and_misaligned_ones_checked(fake_device):
    op = pool.PerHorizonAttentionPool(H, D)
    shapes = [(H, D), (2, 9, D), (2, H, 9), (2, H, D), (2, H, D), None]
    program = _program(op, "pool_backward", shapes)
    [kernel, *_] = program.launches
    pointers = {at for at, *_ in kernel.pointers}
    named = dict(zip(kernel.kernel.params, range(len(kernel.kernel.params))))
    assert named["grad_attn"] not in pointers and kernel.values[named["grad_attn"]] == 0
    spec = tops._SPECS["pool_backward"]
    misaligned = [core_program.ArraySpec((H, D), np.dtype(np.float32), 4),
                  *(core_program.ArraySpec(s, np.dtype(np.float32)) for s in shapes[1:5]), None]
    with pytest.raises(ValueError, match="^q_h: device pointer .* is not 16-byte aligned"):
        core_program.record(lambda arrays: spec.call(op, arrays), misaligned, spec.outputs)


def test_a_program_runs_its_launches_with_the_callers_addresses(fake_device, monkeypatch):
    op = frdhead.FrdHead(I, F, H, A)
    program = _program(op, "frdhead_grad_w2", [(4, F), (H, A, F), (4, H, A)])
    made = []
    for launch in program.launches:
        monkeypatch.setattr(launch.kernel, "launch_values",
                            lambda grid, block, values, shared, stream: made.append(values),
                            raising=False)
    program.run([1000, 2000, 3000], [50000, 60000], 70000, stream=7)
    kernel, reduce = program.launches
    values = dict(zip(kernel.kernel.params, made[0]))
    assert (values["hidden"], values["w2"], values["grad_logits"]) == (1000, 2000, 3000)
    assert values["dhidden"] == 60000 and values["scratch"] == 70000
    assert dict(zip(reduce.kernel.params, made[1]))["y"] == 50000


def test_adam_step_in_place_on_its_cpu_kernel(cpu_kernels):
    p, g, m, v = (torch.randn(20) for _ in range(4))
    v = v.abs()
    want = torch_step(torch, p, g, m, v, 2)
    torch.ops.pycuda_heads.adam_step(p, g, m, v, 2, 0)
    assert all(torch.equal(a, b) for a, b in zip((p, m, v), want))


def test_the_adam_only_floor_steps_every_parameter_with_its_gradient_kept():
    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, 2))]
    step = torch_train.adam_step(torch, params)
    step()
    step()
    assert all(torch.allclose(p, torch.full_like(p, -2e-3)) for p in params)
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in params)
