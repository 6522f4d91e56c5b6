"""Wide-head pool forward prototype (wide.cu) against the float64 reference and the library's
tuned pool forward at the suite's wide shapes and odd ones: max relative error of ctx and attn,
bitwise reruns, pass or fail by the library's validation tolerance, GPU time beside the library's and the memory floor. Not shipped: it says whether
tensor-core products (3xTF32 mma.sync, horizons as the n dimension) are worth a layout.

    source .gpu/env.sh && python probes/pool_wide/run.py OUT.json
"""
from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pycuda.gpuarray as ga

from pycuda_heads import reference as ref
from pycuda_heads.core import device
from pycuda_heads.ops.pool import PerHorizonAttentionPool
from pycuda_heads.perf.bench import CudaHarness
from pycuda_heads.perf.timing import gpu_time_us
from pycuda_heads.records import git_state
from pycuda_heads.verify.checks import compare

HERE = Path(__file__).resolve().parent
SM_SHARED = 233472  # shared memory an H200 SM holds (bytes)
# (H, D, B, K): the suite's H=32 and H=8/D=512 shapes, then partial chunks and one key
SHAPES = ((32, 128, 512, 64), (8, 512, 1024, 128), (16, 256, 256, 64),
          (32, 128, 3, 100), (8, 512, 2, 1), (32, 1024, 2, 9))
# (WARPS, KC); variants whose sizes break wide.cu's rules at a shape are skipped there. Each
# with TF32_RN 0 and 1 (operand halves truncated or rounded), on a grid of B blocks (a row a
# block) and on a persistent grid (as many blocks as fit on the SMs, each looping over rows).
POINTS = ((4, 64), (2, 32), (8, 128), (4, 128))
ROUNDING = (0, 1)
GRIDS = ("rows", "persistent")


def floats(h: int, d: int, warps: int, kc: int, k: int) -> int:
    """WIDE_FLOATS of wide.cu."""
    kp = -(-k // kc) * kc
    return h * (d + 8) + 2 * kc * (d + 8) + h * (kc + 8) + h * kp + 3 * h


def fits(h: int, d: int, warps: int, kc: int, k: int) -> bool:
    nth = 32 * warps
    return (h % 8 == 0 and d % (16 * warps) == 0 and kc % (16 * warps) == 0 and nth % h == 0
            and nth // h <= 32 and 4 * floats(h, d, warps, kc, k) <= device.max_shared_bytes())


def main(out: str) -> None:
    from pycuda.compiler import SourceModule
    bandwidth = CudaHarness().copy_bandwidth_gbps()
    rng = np.random.default_rng(0)
    record = {"what": __doc__.split("\n")[0], "commit": git_state()["describe"],
              "gpu": device.gpu_name(), "copy_bandwidth_GBps": round(bandwidth, 1), "shapes": []}
    modules = {}
    for h, d, b, k in SHAPES:
        q = rng.standard_normal((h, d)).astype(np.float32)
        ln = rng.standard_normal((b, k, d)).astype(np.float32)
        want_ctx, want_attn = ref.pool_forward(q, ln)
        f32_ctx, f32_attn = ref.pool_forward(q, ln, dtype=np.float32)
        d_q, d_ln = ga.to_gpu(q), ga.to_gpu(ln)
        lib = PerHorizonAttentionPool(h, d)
        lctx, lattn = lib.forward(d_q, d_ln)
        entry = {"H": h, "D": d, "B": b, "K": k,
                 "floor_us": 4 * (b * k * d + b * h * k + b * h * d) / bandwidth / 1e3,
                 "library": {"params": lib.chosen["forward"]["params"],
                             "checks": {"ctx": compare(lctx.get(), want_ctx, f32_ctx),
                                        "attn": compare(lattn.get(), want_attn, f32_attn)},
                             "forward_us": gpu_time_us(lambda: lib.forward(d_q, d_ln))["median_us"]},
                 "points": []}
        for (warps, kc), rn, grid_mode in itertools.product(POINTS, ROUNDING, GRIDS):
            if not fits(h, d, warps, kc, k):
                continue
            key = (h, d, warps, kc, rn)
            if key not in modules:
                with device.thread_context():
                    mod = SourceModule((HERE / "wide.cu").read_text(), no_extern_c=True,
                                       arch="sm_90", include_dirs=[str(HERE)], options=[
                                           f"-DN_HORIZONS={h}", f"-DHIDDEN_DIM={d}",
                                           f"-DWARPS={warps}", f"-DKC={kc}", f"-DTF32_RN={rn}"])
                modules[key] = mod.get_function("wide_forward")
            fn, shared = modules[key], 4 * floats(h, d, warps, kc, k)
            fn.set_attribute(device.cuda().function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
            per_sm = max(1, min(SM_SHARED // (shared + 1024), 2048 // (32 * warps),
                                65536 // (32 * warps * max(fn.num_regs, 1))))
            blocks = b if grid_mode == "rows" else min(b, per_sm * device.sm_count())
            ctx, attn = ga.empty((b, h, d), np.float32), ga.empty((b, h, k), np.float32)

            def run(ctx=ctx, attn=attn, fn=fn, shared=shared, blocks=blocks, warps=warps):
                fn(d_q.gpudata, d_ln.gpudata, ctx.gpudata, attn.gpudata, np.int32(b),
                   np.int32(k), np.float32(1 / np.sqrt(d)), grid=(blocks, 1, 1),
                   block=(32 * warps, 1, 1), shared=shared)
            run()
            first = (ctx.get(), attn.get())
            run()
            point = {"WARPS": warps, "KC": kc, "TF32_RN": rn, "grid": grid_mode,
                     "blocks": blocks, "registers": fn.num_regs, "shared_bytes": shared,
                     "checks": {"ctx": compare(first[0], want_ctx, f32_ctx),
                                "attn": compare(first[1], want_attn, f32_attn)},
                     "rerun_bitwise": bool((ctx.get() == first[0]).all()
                                           and (attn.get() == first[1]).all()),
                     "forward_us": gpu_time_us(run)["median_us"]}
            entry["points"].append(point)
            print(h, d, b, k, warps, kc, rn, grid_mode, "%.1f us" % point["forward_us"],
                  "(library %.1f, floor %.1f)" % (entry["library"]["forward_us"], entry["floor_us"]),
                  "rel err %.2e" % max(c["max_rel_err"] for c in point["checks"].values()),
                  "passes" if all(c["passed"] for c in point["checks"].values()) else "FAILS",
                  "(the library's tolerance)", flush=True)
        record["shapes"].append(entry)
        Path(out).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
