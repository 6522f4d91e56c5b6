"""CPU probe: does the form of the library's parameter gradients slow torch's fused Adam step?
The resgate and frdhead backward kernels write one row [weights | biases]; the formulas handed
out pieces of it, so three of the pool model's four gradients shared one storage (alpha's at a
byte offset of 2580). Here, with the operators' CPU stand-ins of tests/test_torch_cpu.py, the
pool model of the torch_train bench (B=8, K=8) runs forward + backward, eager and compiled, and
``opt.step()`` alone is timed: the library's gradients as returned and as fresh copies, against
plain torch's. The implementations take turns, 25 rounds of 60 steps; medians and minima of the
rounds' medians (us). Run it with each form of the formulas to compare (the .txt beside it:
pieces as returned, then each piece cloned in the formulas; no effect above this machine's
noise, so the formulas were left as they are):

    python -m pytest -q -s -p no:cacheprovider probes/torch_grad_storage_cpu.py
"""
import statistics
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
torch = pytest.importorskip("torch")
from fakes import fake_gpu  # noqa: E402,F401  (fixtures)
from test_torch_cpu import cpu_kernels, fake_device  # noqa: E402,F401

from pycuda_heads.perf import torch_train  # noqa: E402


def _adam_timer(impl: str, copies: bool, compiled: bool):
    library, plain, lib_params, plain_params = torch_train.pool_models(torch, device="cpu")
    fn, params = (library, lib_params) if impl == "library" else (plain, plain_params)
    if compiled:
        fn = torch.compile(fn, fullgraph=True, dynamic=False)
    inputs = torch_train.batch(torch, "pool", {"B": 8, "K": 8}, device="cpu")
    opt = torch.optim.Adam(params, lr=1e-3, fused=True)
    leaves = [x for x in inputs if x.requires_grad]

    def run(steps: int) -> float:
        times = []
        for _ in range(steps):
            fn(*inputs).backward()
            if copies:
                for p in params:
                    p.grad = p.grad.clone()
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
            opt.zero_grad(set_to_none=True)
            for x in leaves:
                x.grad = None
        return statistics.median(times) * 1e6
    run(50)
    return run


def test_adam_host_time_after_backward(cpu_kernels, fake_device):  # noqa: F811
    for compiled in (False, True):
        timers = {(impl, copies): _adam_timer(impl, copies, compiled)
                  for impl in ("library", "torch") for copies in (False, True)}
        rounds = {key: [] for key in timers}
        for _ in range(25):
            for key, run in timers.items():
                rounds[key].append(run(60))
        for (impl, copies), got in rounds.items():
            print(f"\n{'compiled' if compiled else 'eager'} {impl} "
                  f"{'copies' if copies else 'as returned'}: median "
                  f"{statistics.median(got):.1f} us, min {min(got):.1f} us", flush=True)
