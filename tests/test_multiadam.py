"""Multi-tensor Adam. CPU: the device's bias corrections are the host's to the bit, the kernel's
float32 arithmetic is per-array Adam's instruction for instruction (nvcc PTX), the table it
walks, and bad arguments raising before any launch (PyCUDA faked). GPU: bitwise per-array Adam
over the smoke model's eight tensors, the device step counter, other launch parameters."""
import re
import shutil
import subprocess

import numpy as np
import pytest

import pycuda_heads as ph
from pycuda_heads.core.compile import recorded_launches
from pycuda_heads.core.source import render
from pycuda_heads.ops import multiadam
from pycuda_heads.ops.multiadam import MultiAdam, host_bias_correction, pieces

from fakes import FakeGPUArray, fake_gpu  # noqa: F401  (a fixture)

SIZES = (640, 640, 5, 5, 16384, 128, 13440, 105)  # the smoke model's parameters


@pytest.mark.parametrize("beta", [0.9, 0.999, 0.99, 0.95])
def test_the_device_bias_correction_is_the_hosts_to_the_bit(beta):
    for t in (*range(1, 20001), 65536, 99999, 10 ** 6):
        assert host_bias_correction(beta, t) == np.float32(1 - beta ** t), t


def _f32_arithmetic(family, entry):
    """The float32 arithmetic opcodes of ``entry`` in nvcc's PTX, in order."""
    source = render(family, {"BLOCK": 256, "ITEMS": 1})
    ptx = subprocess.run(["nvcc", "-arch=sm_90", "-O3", "-ptx", "-x", "cu", "-", "-o", "-"],
                         input=source, capture_output=True, text=True, check=True).stdout
    body = ptx[ptx.index(f".entry {entry}("):]
    body = body[: body.index("\n}")]
    return re.findall(r"^\s+((?:fma|mul|add|sub|div|sqrt|rcp)(?:\.\w+)*\.f32)\s", body, re.M)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_element_update_is_per_array_adams_instruction_for_instruction():
    mine, theirs = _f32_arithmetic("multiadam", "multiadam_step"), \
        _f32_arithmetic("adam", "adam_step")
    assert mine == theirs and "div.rn.f32" in mine and "sqrt.rn.f32" in mine


@pytest.mark.parametrize("n", [1, 2, 3, 7, 1000, 31347])
def test_the_pieces_cover_every_element_once(n):
    got = pieces(n)
    assert got[0] == (0, 1) and sum(length for _, length in got) == n
    assert all(a + length == b for (a, length), (b, _) in zip(got, got[1:]))


@pytest.fixture
def tables(fake_gpu, monkeypatch):
    """The tables MultiAdam copies to the (fake) device, as NumPy arrays."""
    import sys
    made = []
    fake = sys.modules["pycuda.gpuarray"]
    real = fake.to_gpu
    monkeypatch.setattr(fake, "to_gpu", lambda a, allocator: made.append(a) or real(a, allocator))
    return made


def _arrays(shapes, counter):
    return [FakeGPUArray(s, np.float32, gpudata=counter(4 * int(np.prod(s)))) for s in shapes]


def test_one_launch_walks_a_table_of_every_tensor(tables, fake_gpu):
    shapes = [(n,) for n in SIZES[:4]] + [(128, 128)]
    p, g, m, v = (_arrays(shapes, fake_gpu) for _ in range(4))
    adam = MultiAdam(launch={"step": {"BLOCK": 64, "ITEMS": 2}})
    with recorded_launches() as launches:
        adam.step_all(p, g, m, v, 3)
        adam.step_all(p, g, m, v, 4)  # the same arrays: the table is reused
    assert len(tables) == 1 and len(launches) == 2
    table = tables[0]
    assert table.shape == (5, multiadam.TABLE_COLS)
    for row, pi, gi, mi, vi in zip(table, p, g, m, v):
        assert list(row[:7]) == [pi.gpudata, gi.gpudata, mi.gpudata, vi.gpudata, pi.gpudata,
                                 mi.gpudata, vi.gpudata]
        assert row[7] == pi.size
    blocks = [-(-n // 128) for n in table[:, 7]]
    assert list(table[:, 8]) == list(np.cumsum([0, *blocks[:-1]]))
    kernel, grid, block, args, *_ = launches[0]
    assert grid == (sum(blocks), 1, 1) and block == (64, 1, 1)
    named = dict(zip(kernel.params, args))
    assert named["n_tensors"] == 5 and named["counters"] == 0 and named["lr_dev"] == 0
    assert named["bc1"] == pytest.approx(1 - 0.9 ** 3, rel=1e-15)
    assert dict(zip(kernel.params, launches[1][3]))["bc2"] == pytest.approx(1 - 0.999 ** 4)


def test_a_scheduled_step_is_one_launch_each_block_advancing_its_own_counter(tables, fake_gpu):
    """No launch of its own advances the device step: the update's blocks each read and write
    their own counter (one writer each), so a training step's graph holds one Adam launch."""
    p, g, m, v = (_arrays([(n,) for n in SIZES], fake_gpu) for _ in range(4))
    adam = MultiAdam(launch={"step": {"BLOCK": 256, "ITEMS": 1}})
    blocks = sum(-(-n // 256) for n in SIZES)
    schedule = object.__new__(ph.AdamSchedule)  # counters enough for the launch: none made
    schedule.counters = FakeGPUArray((blocks,), np.int32, gpudata=fake_gpu(4 * blocks))
    schedule.lr = FakeGPUArray((1,), np.float32, gpudata=fake_gpu(4))
    with recorded_launches() as launches:
        adam.step_scheduled(p, g, m, v, schedule)
    assert len(launches) == 1
    kernel, grid, _, args, *_ = launches[0]
    named = dict(zip(kernel.params, args))
    assert grid == (blocks, 1, 1)
    assert named["counters"] == schedule.counters.gpudata and named["lr_dev"] == schedule.lr.gpudata
    assert (named["beta1_64"], named["beta2_64"]) == (0.9, 0.999)  # doubles, as the host's


def test_bad_arguments_raise_before_any_launch(tables, fake_gpu):
    p, g, m, v = (_arrays([(5,), (3, 2)], fake_gpu) for _ in range(4))
    adam = MultiAdam()
    with recorded_launches() as launches:
        with pytest.raises(ValueError, match="t: expected the step number"):
            adam.step_all(p, g, m, v, 0)
        with pytest.raises(ValueError, match=r"grads\[1\]: expected shape"):
            adam.step_all(p, [g[0], FakeGPUArray((2, 3), np.float32, gpudata=64)], m, v, 1)
        with pytest.raises(TypeError, match=r"ms\[0\]: expected dtype float32"):
            adam.step_all(p, g, [FakeGPUArray((5,), np.float64, gpudata=64), m[1]], v, 1)
        with pytest.raises(TypeError, match=r"params\[0\]: expected a device array"):
            adam.step_all([np.ones(5, np.float32), p[1]], g, m, v, 1)
        with pytest.raises(ValueError, match="vs: expected a list of 2 device arrays"):
            adam.step_all(p, g, m, v[:1], 1)
    assert launches == [] and tables == []


# --- GPU ----------------------------------------------------------------------------------------

def _model_tensors(rng):
    return [rng.standard_normal(n, dtype=np.float32) for n in SIZES]


@pytest.mark.gpu
@pytest.mark.parametrize("params", [None, {"BLOCK": 64, "ITEMS": 8}, {"BLOCK": 1024, "ITEMS": 1}],
                         ids=["default", "B64-I8", "B1024-I1"])
def test_one_launch_is_bitwise_per_array_adam_and_the_device_counter_is_the_hosts(params):
    import pycuda.gpuarray as gpuarray
    rng = np.random.default_rng(7)
    p0 = _model_tensors(rng)
    grads = [_model_tensors(rng) for _ in range(4)]
    adam, multi = ph.Adam(lr=3e-3), MultiAdam(lr=3e-3, launch=params and {"step": params})
    state = {k: [[gpuarray.to_gpu(x if j == 0 else np.zeros_like(x)) for x in p0]
                 for j in range(3)] for k in ("one", "all", "scheduled")}
    schedule = ph.AdamSchedule(3e-3)
    for t, g in enumerate(grads, 1):
        g_dev = [gpuarray.to_gpu(x) for x in g]
        for i, gi in enumerate(g_dev):
            p, m, v = (state["one"][j][i] for j in range(3))
            adam.step(p, gi, m, v, t, inplace=True)
        multi.step_all(*state["all"][:1], g_dev, *state["all"][1:], t)
        multi.step_scheduled(*state["scheduled"][:1], g_dev, *state["scheduled"][1:], schedule)
    host = {k: [np.concatenate([x.get() for x in arrays]) for arrays in v]
            for k, v in state.items()}
    for j in range(3):  # param, m, v
        assert host["all"][j].tobytes() == host["one"][j].tobytes()
        assert host["scheduled"][j].tobytes() == host["one"][j].tobytes()
    assert schedule.t == 4


@pytest.mark.gpu
def test_the_learning_rate_on_the_device_is_read_by_the_next_step():
    import pycuda.gpuarray as gpuarray
    rng = np.random.default_rng(8)
    p0, g = rng.standard_normal(1000, dtype=np.float32), rng.standard_normal(1000, dtype=np.float32)
    runs = []
    for lr in (1e-3, 1e-2):
        p, m, v = (gpuarray.to_gpu(a) for a in (p0, np.zeros_like(p0), np.zeros_like(p0)))
        schedule = ph.AdamSchedule(1e-3)
        schedule.set_lr(lr)
        MultiAdam(lr=1e-3).step_scheduled([p], [gpuarray.to_gpu(g)], [m], [v], schedule)
        runs.append(p.get())
    want = ph.Adam(lr=1e-2).step(p0, g, np.zeros_like(p0), np.zeros_like(p0), 1)[0].get()
    assert runs[1].tobytes() == want.tobytes() and runs[0].tobytes() != runs[1].tobytes()
