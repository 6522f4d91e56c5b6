"""Issue 34 probe: where the pool's fwd+bwd time goes at B=1024, K=128, the last default-width
shape short of 75% of its floor (71.5 us against a 50.7 us floor; its passes alone add up to
68.0). GPU time of each pass alone, of the backward's layout kernel alone and of its reduce
alone (the op's own launches on buffers made once), and of fwd+bwd chained (the bench's row);
each also after an L2 flush (a 256 MB fill; the fill's own time taken off), to see how much
of a pass alone is served by what the previous repetition left in L2. B=4096, K=64 (77% of its
floor) is the contrast. Other shapes as H,D,B,K arguments (e.g. 32,128,512,64 for the wide ones).

    source .gpu/env.sh && python probes/pool_chain.py $OUT/pool_chain.json [H,D,B,K ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pycuda.gpuarray as ga

import pycuda_heads as ph
from pycuda_heads.core import device
from pycuda_heads.ops.reduce import reducer
from pycuda_heads.perf.bench import CudaHarness
from pycuda_heads.perf.timing import gpu_time_us
from pycuda_heads.records import git_state

SHAPES = ((5, 128, 1024, 128), (5, 128, 4096, 64))
FLUSH_BYTES = 256 << 20  # five times the L2


def median(fn) -> float:
    return gpu_time_us(fn)["median_us"]


def main(out: str, shapes: tuple[tuple[int, int, int, int], ...]) -> None:
    device.cuda()
    bandwidth = CudaHarness().copy_bandwidth_gbps()
    flush_buf = ga.empty(FLUSH_BYTES // 4, np.float32)

    def flush() -> None:
        flush_buf.fill(np.float32(0))

    flush_us = median(flush)
    record = {"what": __doc__.split("\n")[0], "commit": git_state()["describe"],
              "gpu": device.gpu_name(), "copy_bandwidth_GBps": round(bandwidth, 1),
              "flush_us": round(flush_us, 2), "shapes": []}
    rng = np.random.default_rng(0)
    for H, D, b, k in shapes:
        q = ga.to_gpu(rng.standard_normal((H, D), dtype=np.float32))
        ln = ga.to_gpu(rng.standard_normal((b, k, D), dtype=np.float32))
        gc = ga.to_gpu(rng.standard_normal((b, H, D), dtype=np.float32))
        pool = ph.PerHorizonAttentionPool(H, D)
        ctx, attn = pool.forward(q, ln)
        pool.backward(q, ln, attn, gc, ctx)
        launch = pool._plans[("backward", b, k)]  # the op's own backward launch at this shape
        blocks = launch.grid[0]
        grad_ln = ga.empty((b, k, D), np.float32)
        scratch = ga.empty((blocks, H * D), np.float32)

        def kernel() -> None:
            launch.kernel(launch.grid, launch.block, q_h=q.gpudata, ln=ln.gpudata,
                          attn=attn.gpudata, grad_ctx=gc.gpudata, grad_attn=np.intp(0),
                          ctx=ctx.gpudata, grad_ln=grad_ln.gpudata, gq_scratch=scratch.gpudata,
                          ds_scratch=np.intp(0), K=k, scale=np.float32(pool.scale), B=b,
                          shared=launch.shared)

        parts = {"forward": lambda: pool.forward(q, ln),
                 "backward": lambda: pool.backward(q, ln, attn, gc, ctx),
                 "backward_kernel": kernel,
                 "reduce": lambda: reducer().sum_rows(scratch, blocks, H * D, None, (H, D)),
                 "fwd+bwd": lambda: _chain(pool, q, ln, gc)}
        warm = {name: round(median(fn), 2) for name, fn in parts.items()}
        cold = {name: round(median(lambda fn=fn: (flush(), fn())) - flush_us, 2)
                for name, fn in parts.items()}
        floor = {"forward": 4 * (b * k * D + b * H * k + b * H * D) / bandwidth / 1e3,
                 "backward": 4 * (2 * b * k * D + b * H * k + 2 * b * H * D) / bandwidth / 1e3}
        entry = {"H": H, "D": D, "B": b, "K": k, "blocks": blocks,
                 "params": pool.chosen["backward"]["params"],
                 "floor_us": {n: round(v, 2) for n, v in floor.items()},
                 "warm_us": warm, "after_flush_us": cold}
        record["shapes"].append(entry)
        print(json.dumps(entry), flush=True)
        Path(out).write_text(json.dumps(record, indent=1))


def _chain(pool, q, ln, gc) -> None:
    """The forward, then the backward given its attn and ctx."""
    ctx, attn = pool.forward(q, ln)
    pool.backward(q, ln, attn, gc, ctx)


if __name__ == "__main__":
    main(sys.argv[1], tuple(tuple(map(int, a.split(","))) for a in sys.argv[2:]) or SHAPES)
