"""Other launch plans of the TrainStep graph, timed beside the shipped one (graph replay, wall
time per step), to pick the plan that shortens the critical path at small batch:

- ``shipped``: the step as it is (FRD forward + softmax-CE + head loss in one launch after the
  pool branch's forward; the FRD backward on a second stream beside the pool branch's);
- ``parallel_forward``: the FRD forward and softmax-CE on the second stream from the start,
  beside the pool and residual/gate forward (they do not depend on each other), then the head
  loss on the first stream, then the backward as shipped: one launch more than ``shipped``, but
  the FRD forward leaves the critical path.

Each plan's loss after 5 eager steps is printed against the shipped plan's (the same math; the
loss's summation order differs, so it agrees to float32 rounding, not bitwise).

    source .gpu/env.sh && python probes/train_step_plans.py $OUT/train_step_plans.json
"""
from __future__ import annotations

import json
import sys
from typing import Any

from pycuda_heads.core.device import cuda
from pycuda_heads.perf import train_bench
from pycuda_heads.perf.step_bench import wall_us
from pycuda_heads.step import TrainStep

SHAPES = ({"B": 2, "K": 8}, {"B": 256, "K": 64})


class ParallelForward(TrainStep):
    """The ``parallel_forward`` plan (see the module's docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        drv = cuda()
        self._fork0, self._join0 = (drv.Event(drv.event_flags.DISABLE_TIMING) for _ in range(2))
        super().__init__(*args, **kwargs)

    def _launch(self, s: Any) -> dict[str, Any]:
        x, p, side = self.inputs, self.params, self._side
        self._fork0.record(s)
        side.wait_for_event(self._fork0)
        hidden, logits = self.head.forward(x["h_t"], p["w1"], p["b1"], p["w2"], p["b2"],
                                           stream=side)
        grad_logits, ce = self.frd.softmax_ce_grad(logits, x["labels"], check_labels=False,
                                                   stream=side)
        self._join0.record(side)
        ctx, attn = self.pool.forward(p["q_h"], x["ln"], stream=s)
        out, residual = self.resgate.forward(ctx, p["w_res"], p["bias_res"], x["base"],
                                             p["alpha"], stream=s)
        s.wait_for_event(self._join0)
        grad_out, grad_logits_w, loss = self.loss.grad(out, x["y"], ce, grad_logits, stream=s)
        self._fork.record(s)
        side.wait_for_event(self._fork)
        g_w2, g_b2, dhidden = self.head.grad_w2(hidden, p["w2"], grad_logits_w, stream=side)
        g_w1, g_b1, _ = self.head.grad_w1(x["h_t"], p["w1"], hidden, dhidden, stream=side)
        self._join.record(side)
        g_wres, g_bres, grad_ctx, _, g_alpha = self.resgate.backward(
            ctx, p["w_res"], p["alpha"], residual, grad_out, stream=s)
        g_q, _ = self.pool.backward(p["q_h"], x["ln"], attn, grad_ctx, ctx=ctx, stream=s)
        s.wait_for_event(self._join)
        grads = {"q_h": g_q, "w_res": g_wres, "bias_res": g_bres, "alpha": g_alpha,
                 "w1": g_w1, "b1": g_b1, "w2": g_w2, "b2": g_b2}
        if not self._arena.measuring:
            self.adam.step_scheduled(list(p.values()), [grads[n] for n in p],
                                     list(self.m.values()), list(self.v.values()),
                                     self.schedule, stream=s)
        return {"loss": loss, "out": out, "logits": logits, "ce": ce,
                **{f"grad_{n}": g for n, g in grads.items()}}


PLANS = {"shipped": TrainStep, "parallel_forward": ParallelForward}


def main(path: str) -> None:
    out = []
    for shape in SHAPES:
        params, data = train_bench.model(shape)
        steps, losses = {}, {}
        for name, cls in PLANS.items():
            step = cls(train_bench.H, train_bench.D, shape["B"], shape["K"],
                       frd_hidden=train_bench.F, n_atoms=train_bench.A, lr=train_bench.LR)
            step.load(params)
            step.feed(**data)
            for _ in range(5):
                loss = step.run()
            step.synchronize()
            losses[name] = float(loss.get()[0])
            step.load(params)
            steps[name] = (step.replay, step.synchronize)
        wall = wall_us(steps)
        row = {"shape": shape, "graph_us": {n: w.get("median_us", w.get("error"))
                                            for n, w in wall.items()},
               "loss_after_5_eager_steps": losses}
        print(json.dumps(row, indent=1), flush=True)
        out.append(row)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
