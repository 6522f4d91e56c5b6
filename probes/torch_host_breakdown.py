"""Where the host time of a PyTorch training step goes on the GPU machine: the layers of one
eager library call (allocation, launch program, autograd Function, module; the Python launcher
and the C++ one), torch's own ops with and without autograd, and a training step cut after each
of its parts (forward, backward, optimizer, zero_grad) for the library and the plain-torch pool
model at B=2, K=8 and at B=4096, K=256, with the full step's GPU time from the profiler's
kernel records; the same cuts under ``torch.compile(mode="reduce-overhead")`` for both
implementations at the two torch_train rows where they were closest (frd B=4096, pool B=256,
K=64). Each number is the fastest of 21 runs of back-to-back calls (11 for the compiled ones).

    source .gpu/env.sh && python probes/torch_host_breakdown.py OUT.json
"""
from __future__ import annotations

import json
import statistics
import sys

import torch

import pycuda_heads.torch as pht
from host_timing import gpu_us, per_call_runs
from pycuda_heads.perf import torch_train
from pycuda_heads.torch import launch, ops
from pycuda_heads.torch.native import native

CALLS, RUNS = 200, 21


def timed(fn, runs: int = RUNS) -> dict[str, float]:
    runs = per_call_runs(fn, torch.cuda.synchronize, CALLS, runs, warm=50)
    return {"min_us": round(min(runs), 2), "median_us": round(statistics.median(runs), 2)}


def step_parts(loss_fn, params, inputs) -> dict:
    opt = torch.optim.Adam(params, lr=1e-3, fused=True)
    leaves = [x for x in inputs if x.requires_grad]

    def clear():
        opt.zero_grad(set_to_none=True)
        for x in leaves:
            x.grad = None

    def no_grad():
        with torch.no_grad():
            loss_fn(*inputs)

    def fwd_bwd():
        loss_fn(*inputs).backward()
        clear()

    def full():
        loss_fn(*inputs).backward()
        opt.step()
        clear()
    return {"forward, no grad": timed(no_grad), "forward": timed(lambda: loss_fn(*inputs)),
            "forward + backward": timed(fwd_bwd), "forward + backward + Adam": timed(full),
            "forward + backward + Adam, GPU time": {"kernels_us": gpu_us(full)}}


def compiled_parts(loss_fn, params, inputs) -> dict:
    """The step's cuts with ``loss_fn`` under reduce-overhead (CUDA graph trees), each call
    marked as a new step as the bench's step marks it."""
    fn = torch.compile(loss_fn, mode="reduce-overhead", fullgraph=True, dynamic=False)
    opt = torch.optim.Adam(params, lr=1e-3, fused=True)
    leaves = [x for x in inputs if x.requires_grad]

    def forward():
        torch.compiler.cudagraph_mark_step_begin()
        return fn(*inputs)

    def clear():
        opt.zero_grad(set_to_none=True)
        for x in leaves:
            x.grad = None

    def fwd_bwd():
        forward().backward()
        clear()

    def full():
        forward().backward()
        opt.step()
        clear()
    return {"forward": timed(forward, 11), "forward + backward": timed(fwd_bwd, 11),
            "forward + backward + Adam": timed(full, 11)}


def main(out: str) -> None:
    dev = "cuda"
    x, y = torch.randn(2, 5, 128, device=dev), torch.randn(2, 5, 128, device=dev)
    xg = x.clone().requires_grad_(True)
    leaf = torch.randn(4, device=dev, requires_grad=True)
    leaf_cpu = torch.randn(4, requires_grad=True)
    pool = pht.AttentionPool(5, 128)
    ln = torch.randn(2, 8, 128, device=dev, requires_grad=True)
    spec = ops._SPECS["pool_forward"]
    method = launch.Method(pool.op, spec.names, spec.call, spec.outputs, native=False)
    native_method = ops._method("pool_forward", pool.op_id)
    method(pool.q_h, ln)
    pool(ln)
    program, device = next(iter(method.programs.values()))
    outs = [torch.empty(shape, device=dev) for shape, _ in program.outputs]
    pointers = [pool.q_h.data_ptr(), ln.data_ptr()]
    out_ptrs = [o.data_ptr() for o in outs]
    stream = launch.raw_stream(0)
    first = program.launches[0]
    values, bases = first.values.copy(), (pointers, out_ptrs, (0,))
    for at, kind, index, offset in first.pointers:
        values[at] = bases[kind][index] + offset
    packed = first.kernel._packed(first.kernel._format, *values)
    rule = ops._RULES["pool_forward"]
    layers = {
        "torch.add": lambda: torch.add(x, y),
        "torch.add, autograd": lambda: torch.add(xg, y),
        "torch.empty [2,5,128] on cuda": lambda: torch.empty((2, 5, 128), device=device),
        "cuLaunchKernelEx (DriverKernel.launch_raw), packed once": lambda: first.kernel.launch_raw(
            first.grid, first.block, packed, first.shared, stream),
        "Program.run (pointers given)": lambda: program.run(pointers, out_ptrs, 0, stream),
        "Method (tensors in, outputs allocated)": lambda: method(pool.q_h, ln),
        "C++ launcher run (tensors in, outputs allocated)":
            lambda: native_method(pool.q_h, ln),
        "autograd Function (_Eager.apply)": lambda: ops._Eager.apply(rule, pool.q_h, ln,
                                                                      pool.op_id),
        "C++ launcher autograd node": lambda: ops.pool_forward(pool.q_h, ln, pool.op_id),
        "AttentionPool module call": lambda: pool(ln),
        "leaf.sum().backward() on cuda": lambda: leaf.sum().backward(),
        "leaf.sum().backward() on cpu": lambda: leaf_cpu.sum().backward(),
    }
    record = {"what": __doc__.split("\n")[0], "gpu": torch.cuda.get_device_name(),
              "cpp_launcher": native() is not None,
              "torch": torch.__version__, "calls": CALLS, "runs": RUNS, "layers": {}, "steps": {}}
    for name, fn in layers.items():
        record["layers"][name] = timed(fn)
        json.dump(record, open(out, "w"), indent=1)
    for shape in ({"B": 2, "K": 8}, {"B": 4096, "K": 256}):
        library, plain, lib_params, plain_params = torch_train.models(torch, "pool")
        for impl, fn, params in (("library", library, lib_params), ("torch", plain, plain_params)):
            record["steps"][f"{impl} B={shape['B']},K={shape['K']}"] = step_parts(
                fn, params, torch_train.batch(torch, "pool", shape))
            json.dump(record, open(out, "w"), indent=1)
    for model, shape in (("frd", {"B": 4096}), ("pool", {"B": 256, "K": 64})):
        library, plain, lib_params, plain_params = torch_train.models(torch, model)
        for impl, fn, params in (("library", library, lib_params), ("torch", plain, plain_params)):
            record["steps"][f"{impl} {model} {shape}, reduce-overhead"] = compiled_parts(
                fn, params, torch_train.batch(torch, model, shape))
            json.dump(record, open(out, "w"), indent=1)
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
