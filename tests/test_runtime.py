"""The runtime's shared state and per-thread scope: CPU checks of the mechanics, and on the GPU
ops launched from four threads at once, each on its own stream, giving one thread's bits."""
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from pycuda_heads.core.arrays import memory_from, poisoned_outputs
from pycuda_heads.core.compile import capturing, recorded_launches
from pycuda_heads.core.runtime import RUNTIME, Runtime, scope

THREADS = 4


def test_a_threads_scope_does_not_reach_another_thread():
    seen = []
    with poisoned_outputs(), capturing(), recorded_launches(), memory_from("arena"):
        here = scope()
        worker = threading.Thread(target=lambda: seen.append(scope()))
        worker.start()
        worker.join()
    assert (here.poison, here.capturing, here.recording, here.source) == (True, True, [], "arena")
    assert seen == [type(here)()]  # the default scope
    assert scope() == type(here)()  # and restored here


def test_nested_scopes_restore_the_outer_one():
    with recorded_launches() as outer:
        with recorded_launches() as inner:
            assert scope().recording is inner
        assert scope().recording is outer and inner is not outer


def test_a_cache_entry_is_made_once_when_threads_ask_together():
    runtime, made, start = Runtime(), [], threading.Barrier(8)

    def make():
        made.append(1)
        return object()

    def ask(_):
        start.wait()
        return runtime.cached(runtime.modules, "variant", make)

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(ask, range(8)))
    assert len(made) == 1 and all(g is got[0] for g in got)


def test_the_runtime_is_one_object():
    from pycuda_heads.core import compile as core_compile, deferred
    from pycuda_heads.ops import reduce
    for module in (core_compile, deferred, reduce):
        assert module.RUNTIME is RUNTIME


# --- GPU -------------------------------------------------------------------------------------

def _model(rng):
    import pycuda_heads as ph
    f32 = np.float32
    x = {"q_h": rng.standard_normal((5, 128), dtype=f32),
         "ln": rng.standard_normal((64, 32, 128), dtype=f32),
         "g": rng.standard_normal((64, 5, 128), dtype=f32),
         "w_res": rng.standard_normal((5, 128), dtype=f32), "bias": rng.standard_normal(5, dtype=f32),
         "head": rng.standard_normal((64, 5), dtype=f32), "alpha": rng.uniform(-1, 1, 5).astype(f32),
         "logits": rng.standard_normal((64, 5, 21), dtype=f32),
         "labels": rng.integers(-1, 21, (64, 5)).astype(np.int32)}
    ops = {"pool": ph.PerHorizonAttentionPool(5, 128), "resgate": ph.ResidualGate(5, 128),
           "frd": ph.FrdSoftmaxCE(5, 21)}
    return x, ops


def _step(ops, d, stream):
    """Pool, residual/gate and FRD, forward and backward, on ``stream``: every output."""
    ctx, attn = ops["pool"].forward(d["q_h"], d["ln"], stream=stream)
    out, residual = ops["resgate"].forward(ctx, d["w_res"], d["bias"], d["head"], d["alpha"],
                                           stream=stream)
    import pycuda.driver as drv
    import pycuda.gpuarray as gpuarray
    gctx = gpuarray.empty_like(d["g"])
    drv.memcpy_dtod_async(gctx.gpudata, d["g"].gpudata, d["g"].nbytes, stream)
    gw, gb, gctx, _, ga = ops["resgate"].backward(ctx, d["w_res"], d["alpha"], residual, d["head"],
                                                  out=gctx, accumulate=True, stream=stream)
    gq, gln = ops["pool"].backward(d["q_h"], d["ln"], attn, gctx, ctx=ctx, stream=stream)
    grad, ce = ops["frd"].softmax_ce_grad(d["logits"], d["labels"], stream=stream)
    return [ctx, attn, out, residual, gw, gb, gctx, ga, gq, gln, grad, ce]


@pytest.mark.gpu
@pytest.mark.parametrize("shared_ops", [True, False], ids=["shared-ops", "ops-per-thread"])
def test_four_threads_on_their_own_streams_give_one_threads_bits(shared_ops):
    import pycuda.driver as drv
    import pycuda.gpuarray as gpuarray

    from pycuda_heads.core.device import thread_context
    x, ops = _model(np.random.default_rng(7))
    dev = {n: gpuarray.to_gpu(v) for n, v in x.items()}
    expected = [o.get().tobytes() for o in _step(ops, dev, None)]
    drv.Context.synchronize()

    def worker(i):
        with thread_context():
            mine = ops if shared_ops else _model(np.random.default_rng(7))[1]
            stream = drv.Stream()
            results = []
            for _ in range(10):
                outs = _step(mine, dev, stream)
                stream.synchronize()
                results.append([o.get().tobytes() for o in outs])
            return results

    with ThreadPoolExecutor(THREADS) as pool:
        runs = list(pool.map(worker, range(THREADS)))
    for t, results in enumerate(runs):
        for r, got in enumerate(results):
            assert got == expected, f"thread {t}, repetition {r}: outputs differ"


@pytest.mark.gpu
def test_the_pinned_pycuda_launches_through_its_own_internals():
    """The private fast path is live on the pinned PyCUDA (the public fallback is only for a
    PyCUDA that lacks it): a PyCUDA upgrade that removes it fails here."""
    import pycuda
    from pycuda._pvt_struct import pack

    from pycuda_heads.core.compile import DriverKernel, get_kernel
    kernel = get_kernel("gate", "gate_forward", {"N_HORIZONS": 5, "BLOCK": 128, "ITEMS": 1})
    assert not isinstance(kernel, DriverKernel) and kernel._pack is pack, pycuda.VERSION
    assert kernel._launch == kernel.function._launch_kernel
