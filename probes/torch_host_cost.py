"""Host cost of a pycuda_heads.torch module call against one torch eager op, per kernel launch.
Cases marked ``module_call`` are one module call each (the goal: at most 1.5x a torch op per
launch); the forward+backward cases add torch's autograd engine and are there to compare.

Each case runs many calls back to back at a shape whose kernels take less GPU time than the
host spends issuing them, so the wall time per call is the host's. The torch yardstick is the
median over a few single-kernel eager ops at the same sizes. Writes JSON to the path given.

    source .gpu/env.sh && python probes/torch_host_cost.py OUT.json
"""
from __future__ import annotations

import json
import statistics
import sys

import torch

import pycuda_heads.torch as pht
from host_timing import per_call_runs
from pycuda_heads.records import git_state
from pycuda_heads.torch.native import native

CALLS, REPS = 2000, 5


def per_call_us(fn) -> float:
    """Median over REPS runs of CALLS calls of the wall time per call (one sync a run)."""
    return statistics.median(per_call_runs(fn, torch.cuda.synchronize, CALLS, REPS, warm=200))


def main(out: str) -> None:
    dev = "cuda"
    x, y = torch.randn(2, 5, 128, device=dev), torch.randn(2, 5, 128, device=dev)
    torch_ops = {"add": lambda: torch.add(x, y), "mul": lambda: torch.mul(x, y),
                 "softmax": lambda: torch.softmax(x, -1), "sum": lambda: x.sum(-1),
                 "relu": lambda: torch.relu(x)}
    yardstick = {name: per_call_us(fn) for name, fn in torch_ops.items()}
    op_us = statistics.median(yardstick.values())

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

    # case -> (call, kernel launches a call makes: the library's and torch's own)
    cases = {
        "AttentionPool forward, no grad": (lambda: pool(ln.detach()), 1),
        "AttentionPool forward": (lambda: pool(ln), 1),
        "ResidualGate forward": (lambda: gate(ctx, hd), 1),
        "FrdHead forward": (lambda: head(h_t), 1),
        "FrdLoss forward (kernel, sum, div)": (lambda: loss(logits, labels), 3),
        "AttentionPool forward+backward (fwd; bwd + reduce)": (pool_fwd_bwd, 3),
        "FrdHead forward+backward (fwd; 2 x (bwd stage + reduce))": (head_fwd_bwd, 5),
    }
    for fn, _ in cases.values():  # compile every kernel before anything is timed
        fn()
    torch.cuda.synchronize()
    record = {"what": __doc__.split("\n")[0], "commit": git_state()["describe"],
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cpp_launcher": native() is not None,
              "calls": CALLS, "reps": REPS, "torch_op_us": round(op_us, 2),
              "torch_ops_us": {k: round(v, 2) for k, v in yardstick.items()}, "cases": []}
    for name, (fn, launches) in cases.items():
        us = per_call_us(fn)
        record["cases"].append({"case": name, "module_call": "backward" not in name,
                                "us_per_call": round(us, 2), "launches": launches,
                                "us_per_launch": round(us / launches, 2),
                                "ratio_to_torch_op": round(us / launches / op_us, 2)})
        with open(out, "w") as f:  # after each case: a run cut short keeps what it measured
            json.dump(record, f, indent=1)
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
