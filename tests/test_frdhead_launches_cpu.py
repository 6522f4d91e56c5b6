"""CPU: what FrdHead.backward launches, with PyCUDA faked (launches recorded, allocations from a
counter): at each engine the kernels ``FrdHead.entries("backward", p)`` names (what identity and
the static check hold to be the variant's code), in order, each weight gradient followed by the
reduce of its own scratch; under WGMMA 2 grad_w1's weight gradient reads the dpre the row launch
wrote, and each launch gets the grid and shared bytes its space declares."""
import numpy as np
import pytest

import pycuda_heads as ph
from pycuda_heads.core import compile as core_compile, device
from pycuda_heads.core.compile import recorded_launches
from pycuda_heads.ops.frdhead import (_wg_batch_split, wb_grad_shared_bytes,
                                      wr_grad_w1_shared_bytes, wr_rows_shared_bytes)

from fakes import FakeGPUArray, fake_gpu  # noqa: F401  (a fixture)

B, SMS = 1000, 132
HEAD = {"D_IN": 128, "FRD_HIDDEN": 128, "N_HORIZONS": 5, "N_ATOMS": 21}


@pytest.fixture
def hopper(fake_gpu, monkeypatch):  # noqa: F811
    monkeypatch.setattr(device, "compute_capability", lambda: (9, 0))
    monkeypatch.setattr(device, "sm_count", lambda: SMS)
    monkeypatch.setattr(core_compile.Kernel, "opt_in", lambda self, shared: None)


def _backward(point):
    head = ph.FrdHead(128, 128, 5, 21, launch={"backward": point})
    addresses = iter(range(1 << 30, 1 << 31, 1 << 24))  # distinct, 16-byte aligned inputs

    def arr(*shape):
        return FakeGPUArray(shape, np.float32, gpudata=next(addresses))
    x = {"h_t": arr(B, 128), "w1": arr(128, 128), "w2": arr(5, 21, 128), "hidden": arr(B, 128),
         "grad_logits": arr(B, 5, 21)}
    with recorded_launches() as made:
        head.backward(*x.values())
    return head, x, [(k.name, grid, args, shared) for k, grid, _, args, shared, _ in made]


@pytest.mark.parametrize("point", [{"WGMMA": 2, "WG": 2, "BK": 32, "OCC": 1, "STAGES": 3},
                                   {"WGMMA": 2, "WG": 1, "BK": 16, "OCC": 2, "STAGES": 4},
                                   {"WGMMA": 1, "WG": 2, "BK": 32, "OCC": 1, "STAGES": 3},
                                   {"WGMMA": 0}], ids=lambda p: f"WGMMA{p['WGMMA']}")
def test_backward_launches_the_entries_it_names(hopper, point):
    head, x, made = _backward(point)
    p = head.launch_params("backward", {"B": B})
    assert {k: p[k] for k in point} == point
    names = [name for name, *_ in made]
    assert [n for n in names if n != "reduce_axis0"] == list(head.entries("backward", p))
    # every weight gradient's scratch is summed by the reduce right after it
    for i, (name, _, args, _) in enumerate(made):
        if name == "reduce_axis0":
            assert args[0] in made[i - 1][2]
    assert names.count("reduce_axis0") == 2


def test_the_fp16_backward_wires_dpre_from_its_row_launch_to_grad_w1(hopper):
    point = {"WGMMA": 2, "WG": 2, "BK": 32, "OCC": 1, "STAGES": 3}
    head, x, made = _backward(point)
    p = head.launch_params("backward", {"B": B})
    (rows, rows_grid, rows_args, rows_shared), (w2, w2_grid, w2_args, w2_shared), _, \
        (w1, w1_grid, w1_args, w1_shared), _ = made
    ptr = {n: int(a.gpudata) for n, a in x.items()}
    # frdhead_f16_rows(grad_logits, hidden, w1, w2, dpre, grad_h_t, B)
    assert rows_args[:4] == (ptr["grad_logits"], ptr["hidden"], ptr["w1"], ptr["w2"])
    assert rows_args[-1] == B and rows_grid == (min(SMS, -(-B // (64 * 2))), 1, 1)
    assert rows_shared == wr_rows_shared_bytes(p, HEAD)
    # frdhead_wg_grad_w2(grad_logits, hidden, scratch, B, rows_per_block)
    blocks, per_block = _wg_batch_split(B, p)
    assert w2_args[:2] == (ptr["grad_logits"], ptr["hidden"]) and w2_args[-2:] == (B, per_block)
    assert w2_grid == w1_grid == (blocks, 1, 1)
    assert w2_shared == wb_grad_shared_bytes("grad_w2", p, HEAD)
    # frdhead_wg_grad_w1_dpre(dpre, h_t, scratch, B, rows_per_block): the rows launch's dpre
    assert w1_args[0] == rows_args[4] and w1_args[1] == ptr["h_t"]
    assert w1_shared == wr_grad_w1_shared_bytes(p, HEAD) < wb_grad_shared_bytes("grad_w1", p, HEAD)
