"""Host cost of a pycuda_heads.torch module call against one torch eager op, per kernel launch.
Cases marked ``module_call`` are one module call each (the goal: at most 1.5x a torch op per
launch); the forward+backward cases add torch's autograd engine and are there to compare, beside
a torch op's own forward+backward through the same engine call.

Each case's time is the host's alone: the time to issue a run of calls back to back, the GPU
drained before the run and the closing synchronisation not timed, with fewer launches per run
than the launch queue holds, so a call whose kernels outlast it would not time the GPU (at B=2
FrdHead's forward kernel took 8.25 us in probes/train_step_kernels.json, under its call's host
time: the check, not a known case). The torch yardstick is the median
over a few single-kernel eager ops at the same sizes, timed the same way. The yardstick and the
cases take turns, round by round, so a host whose speed drifts during the probe moves both
alike: a case's ratio is the median over the rounds of its time per launch over that round's
yardstick. Beside it, the same ops recording autograd (``ratio_to_torch_op_autograd``): a
module call records autograd for its parameters, which the goal's yardstick does not. Each
case also gets its kernels' GPU time and count per call (the profiler's records, a check of
the launches counted by hand); ``gpu_bound`` flags one whose kernels take at least 90% of its
host time, which back-to-back wall time would have measured instead. Writes JSON to the path
given.

    source .gpu/env.sh && python probes/torch_host_cost.py OUT.json
"""
from __future__ import annotations

import json
import statistics
import sys

import torch

import pycuda_heads.torch as pht
from host_timing import gpu_work, issue_runs
from pycuda_heads.records import git_state
from pycuda_heads.torch.native import native

# at most 5 launches a call: 150 calls stay within the launch queue, so no run waits on the GPU
CALLS, RUNS, ROUNDS = 150, 8, 15
NO_GRAD = ("AttentionPool forward, no grad",)


def per_call_us(fn) -> float:
    """The host time per call to issue CALLS calls, the median of RUNS runs."""
    return statistics.median(issue_runs(fn, torch.cuda.synchronize, CALLS, RUNS, warm=20))


def main(out: str) -> None:
    dev = "cuda"
    x, y = torch.randn(2, 5, 128, device=dev), torch.randn(2, 5, 128, device=dev)
    torch_ops = {"add": lambda: torch.add(x, y), "mul": lambda: torch.mul(x, y),
                 "softmax": lambda: torch.softmax(x, -1), "sum": lambda: x.sum(-1),
                 "relu": lambda: torch.relu(x)}
    # the same ops recording autograd (on a tensor that takes a gradient, as a module's
    # parameters do): context beside the goal's yardstick, which stays the ops above
    xg = x.clone().requires_grad_(True)
    torch_ops_grad = {"add": lambda: torch.add(xg, y), "mul": lambda: torch.mul(xg, y),
                      "softmax": lambda: torch.softmax(xg, -1), "sum": lambda: xg.sum(-1),
                      "relu": lambda: torch.relu(xg)}

    pool, gate = pht.AttentionPool(5, 128), pht.ResidualGate(5, 128)
    head, loss = pht.FrdHead(128, 128, 5, 21), pht.FrdLoss(5, 21)
    ln = torch.randn(2, 8, 128, device=dev, requires_grad=True)
    ctx = torch.randn(2, 5, 128, device=dev, requires_grad=True)
    hd = torch.randn(2, 5, device=dev, requires_grad=True)
    h_t = torch.randn(2, 128, device=dev, requires_grad=True)
    logits = torch.randn(2, 5, 21, device=dev, requires_grad=True)
    labels = torch.randint(-1, 21, (2, 5), device=dev, dtype=torch.int32)

    # gradients handed back, not accumulated into .grad (which would add torch kernels)
    def pool_fwd_bwd():
        c, _ = pool(ln)
        torch.autograd.grad(c, [pool.q_h, ln], c)

    def head_fwd_bwd():
        out = head(h_t)
        torch.autograd.grad(out, [h_t, *head.parameters()], out)

    # torch's own forward+backward through the same engine call: what the engine costs a torch op
    def relu_fwd_bwd():
        out = torch.relu(xg)
        torch.autograd.grad(out, [xg], out)

    # case -> (call, kernel launches a call makes: the library's and torch's own); the no-grad
    # case is timed with grad mode off (as under torch.no_grad), its input made once
    ln_const = ln.detach()
    cases = {
        "AttentionPool forward, no grad": (lambda: pool(ln_const), 1),
        "AttentionPool forward": (lambda: pool(ln), 1),
        "ResidualGate forward": (lambda: gate(ctx, hd), 1),
        "FrdHead forward": (lambda: head(h_t), 1),
        "FrdLoss forward (kernel, sum, div)": (lambda: loss(logits, labels), 3),
        "AttentionPool forward+backward (fwd; bwd + reduce)": (pool_fwd_bwd, 3),
        "FrdHead forward+backward (fwd; 2 x (bwd stage + reduce))": (head_fwd_bwd, 5),
        "torch relu forward+backward (relu; threshold_backward)": (relu_fwd_bwd, 2),
    }
    for fn, _ in cases.values():  # compile every kernel before anything is timed
        fn()
    torch.cuda.synchronize()
    # a case whose kernels take about as long as the host's call measures the GPU, not the host
    gpu = {}
    for name, (fn, _) in cases.items():
        with torch.set_grad_enabled(name not in NO_GRAD):
            gpu[name] = gpu_work(fn)
    ops: dict[str, list[float]] = {name: [] for name in torch_ops}
    ops_grad: dict[str, list[float]] = {name: [] for name in torch_ops_grad}
    yardstick: list[float] = []
    yardstick_grad: list[float] = []
    times: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(ROUNDS):  # each round in a rotated order
        names = list(cases)
        for name in names[r % len(names):] + names[:r % len(names)]:
            with torch.set_grad_enabled(name not in NO_GRAD):
                times[name].append(per_call_us(cases[name][0]))
        for name, fn in torch_ops.items():
            ops[name].append(per_call_us(fn))
        yardstick.append(statistics.median(ops[name][-1] for name in ops))
        for name, fn in torch_ops_grad.items():
            ops_grad[name].append(per_call_us(fn))
        yardstick_grad.append(statistics.median(ops_grad[name][-1] for name in ops_grad))
    op_us = statistics.median(yardstick)
    record = {"what": __doc__.split("\n")[0], "commit": git_state()["describe"],
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cpp_launcher": native() is not None, "calls": CALLS, "runs": RUNS, "rounds": ROUNDS,
              "timing": "host time to issue the calls (the GPU drained before, not timed after)",
              "torch_op_us": round(op_us, 2),
              "torch_ops_us": {k: round(statistics.median(v), 2) for k, v in ops.items()},
              "torch_op_autograd_us": round(statistics.median(yardstick_grad), 2),
              "torch_ops_autograd_us": {k: round(statistics.median(v), 2)
                                        for k, v in ops_grad.items()},
              "cases": []}
    for name, (_, launches) in cases.items():
        us = statistics.median(times[name])
        ratios = [t / launches / y for t, y in zip(times[name], yardstick)]
        ratios_grad = [t / launches / y for t, y in zip(times[name], yardstick_grad)]
        record["cases"].append({"case": name, "module_call": "backward" not in name
                                and not name.startswith("torch"),
                                "us_per_call": round(us, 2), "launches": launches,
                                "us_per_launch": round(us / launches, 2),
                                "ratio_to_torch_op": round(statistics.median(ratios), 2),
                                "ratio_range": [round(min(ratios), 2), round(max(ratios), 2)],
                                "ratio_to_torch_op_autograd":
                                    round(statistics.median(ratios_grad), 2),
                                "gpu_us_per_call": gpu[name][0],
                                "kernels_per_call": gpu[name][1],
                                "gpu_bound": gpu[name][0] >= 0.9 * us})
    with open(out, "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
