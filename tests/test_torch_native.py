"""CPU: the C++ launcher builds with this machine's compiler and torch, and what it cannot
launch here (no GPU) it still refuses the way the Python launcher does: a program's record
raises its named error through the launcher, and arguments that are not tensors are refused."""
import shutil

import pytest

torch = pytest.importorskip("torch")

from pycuda_heads.torch import native as native_module  # noqa: E402  (needs torch)


@pytest.fixture(scope="module")
def lib():
    if native_module.cuda_include() is None or shutil.which("c++") is None:
        pytest.skip("building the C++ launcher needs a C++ compiler and CUDA's cuda.h")
    return native_module.build()


def test_it_builds_and_launches_nothing_yet(lib):
    assert lib.launch_count() == 0


def test_a_records_error_reaches_the_caller_unchanged(lib):
    calls = []

    def record(tensors):
        calls.append(len(tensors))
        raise TypeError("ln: expected a CUDA tensor, got one on cpu")

    handle = lib.method(record)
    x = torch.zeros(2, 3)
    for _ in range(2):  # nothing is cached for a signature that failed
        with pytest.raises(TypeError, match=r"\bln\b"):
            lib.run(handle, x, None)
    assert calls == [2, 2] and lib.launch_count() == 0


def test_an_argument_that_is_not_a_tensor_is_refused_by_the_records_checks(lib):
    seen = []

    def record(given):
        seen.append(given)
        raise TypeError("ln: expected a torch.Tensor, got int")

    handle = lib.method(record)
    x = torch.zeros(2)
    with pytest.raises(TypeError, match=r"^ln: expected a torch.Tensor"):
        lib.run(handle, x, 3)
    with pytest.raises(TypeError, match=r"^ln: expected a torch.Tensor"):
        lib.apply(lib.rule("probe", [], [], [], lambda *a: ()), handle, x, "q_h", 0)
    assert [g[1] for g in seen] == [3, "q_h"] and lib.launch_count() == 0
    # checks that pass a non-tensor all the same: the launcher still refuses it
    with pytest.raises(TypeError, match="argument 1 is not a tensor"):
        lib.run(lib.method(lambda given: None), x, 3)
    with pytest.raises(RuntimeError, match="no method"):
        lib.run(handle + 1000)
    with pytest.raises(TypeError):
        lib.run("not a handle", x)


def test_an_autograd_rule_registers_and_its_node_runs_the_method(lib):
    def record(tensors):
        raise ValueError("x: expected shape [B, K, D]")

    rule = lib.rule("probe", [0], [], [], lambda op, saved, *grads: (None,))
    handle = lib.method(record)
    with pytest.raises(ValueError, match=r"\bx\b"):
        lib.apply(rule, handle, torch.zeros(3, requires_grad=True), 0)
