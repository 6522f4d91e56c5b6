"""Wide-head pool prototype (wide.cu) against the float64 reference and the library's tuned pool
at the suite's wide shapes and odd ones: errors judged by the library's validation tolerance
(``verify.checks.compare``), bitwise reruns, GPU time beside the library's and the memory floor,
forward and (N_HORIZONS a multiple of 16) backward given ctx. Not shipped: it says whether
tensor-core products (3xTF32 mma.sync, horizons as the n dimension) are worth a layout.

    source .gpu/env.sh && python probes/pool_wide/run.py OUT.json [first] [rows] [dsplit] [whole]

The versions to run (default all): `rate`, mma.sync's TF32 rate on this GPU (their ceiling);
`first`, the first two (`wide_forward`, `wide_backward`);
`rows`, the third (`wide_forward_rows`, `wide_backward_rows`: a block a row, 16 horizons a warp,
all but the ln ring and the backward's sd in registers); `dsplit`, the fourth
(`wide_forward_dsplit`, `wide_backward_dsplit`: the warps split D, for wide rows); `whole`, the
fifth (`wide_forward_whole`, `wide_backward_whole`: a block holds a whole row, every product
spread over all its warps).
"""
from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pycuda.gpuarray as ga

from pycuda_heads import reference as ref
from pycuda_heads.core import device
from pycuda_heads.core.sizes import HeaderSizes
from pycuda_heads.ops.pool import PerHorizonAttentionPool
from pycuda_heads.ops.reduce import reducer
from pycuda_heads.perf.bench import CudaHarness
from pycuda_heads.perf.timing import gpu_time_us
from pycuda_heads.records import git_state
from pycuda_heads.verify.checks import compare

HERE = Path(__file__).resolve().parent
SIZES = HeaderSizes(HERE / "wide.cu")  # its *_FLOATS macros: each launch's shared memory
SM_SHARED = 233472  # shared memory an H200 SM holds (bytes)
# (H, D, B, K): the suite's H=32 and H=8/D=512 shapes, then partial chunks and one key
SHAPES = ((32, 128, 512, 64), (8, 512, 1024, 128), (16, 256, 256, 64),
          (32, 128, 3, 100), (8, 512, 2, 1), (32, 1024, 2, 9))
# (WARPS, KC); variants whose sizes break wide.cu's rules at a shape are skipped there. Each
# on a grid of B blocks (a row a block) and on a persistent grid (as many blocks as fit on the
# SMs, each looping over rows). Operand halves are truncated to tf32 (rounding them, TF32_RN,
# measured at d525cc4: 10-25% slower for at most half the error, dropped).
POINTS = ((4, 64), (2, 32), (8, 128), (4, 128))
GRIDS = ("rows", "persistent")
# the third version: (KC, RSTAGES); the forward at KC 16 with two slots spills, so it is left
# out; the backward takes KC a multiple of 16 a warp
ROWS_POINTS = ((16, 3), (32, 3), (64, 2))
# the fourth version: (DC, RSTAGES), columns a warp and ring slots of 16 keys
DSPLIT_POINTS = ((32, 3), (64, 3), (128, 3), (128, 4), (256, 2))
# the fifth version: (WARPS, SNS, GN, QG): warps, the scores' horizon splits, grad_ln's n8 tiles
# an item, q and G through L1 (1) or staged in shared memory (0); the points that compile
# without spills (SA, each product in accumulators of its own, measured at 33d6179 and dropped)
WHOLE_POINTS = ((8, 1, 4, 0), (8, 1, 4, 1), (4, 1, 8, 1))
VERSIONS = ("first", "rows", "dsplit", "whole", "rate")


def up(n: int, m: int) -> int:
    return -(-n // m) * m


def shared_floats(name: str, k: int = 0, **defines: int) -> int:
    """wide.cu's <name>_FLOATS, a launch's shared floats, at a module's -D constants and K (as
    KP: K rounded up to KC)."""
    return SIZES.value(f"{name}_FLOATS", {**defines, "KP": up(k, defines["KC"])})


def dsplit_points(h: int, d: int) -> list[tuple[int, int]]:
    """The fourth version's (DC, RSTAGES) at H, D: its sizes' rules, at most 64 accumulators a
    lane (DC * H <= 2048) and 1024 threads."""
    if h % 8 or h > 32:
        return []
    return [(dc, st) for dc, st in DSPLIT_POINTS
            if d % dc == 0 and dc * h <= 2048 and d // dc <= 32]


def whole_points(h: int, d: int, k: int) -> list[dict[str, int]]:
    """The fifth version's modules at H, D, K that keep its rules and fit shared memory."""
    out = []
    for warps, sns, gn, qg in WHOLE_POINTS:
        sizes = {"N_HORIZONS": h, "HIDDEN_DIM": d, "WARPS": warps, "KMAX": up(k, 16),
                 "SNS": sns, "GN": gn, "QG": qg}
        floats = max(SIZES.value("WHOLE_FLOATS", sizes), SIZES.value("WHOLE_BWD_FLOATS", sizes))
        if (h % 8 == 0 and d % (16 * warps) == 0 and (h // 8) % sns == 0 and d % (8 * gn) == 0
                and 4 * floats <= device.max_shared_bytes()):
            out.append(sizes)
    return out


def rows_fit(h: int, d: int, floats: int) -> bool:
    return h % 16 == 0 and d % 8 == 0 and d <= 128 and 4 * floats <= device.max_shared_bytes()


def fits(h: int, d: int, warps: int, kc: int, floats: int, backward: bool) -> bool:
    nth = 32 * warps
    rules = (h % 8 == 0 and d % (16 * warps) == 0 and kc % (16 * warps) == 0 and nth % h == 0
             and nth // h <= 32)
    if backward:
        rules = rules and h % 16 == 0 and d % (8 * warps) == 0
    return rules and 4 * floats <= device.max_shared_bytes()


def first_versions(h: int, d: int, warps: int, kc: int) -> dict[str, int]:
    """The -D constants of the first two versions' module."""
    return {"N_HORIZONS": h, "HIDDEN_DIM": d, "WARPS": warps, "KC": kc,
            **({"BWD": 1} if h % 16 == 0 else {})}


class Variants:
    """wide.cu's entries, one module per set of -D constants."""

    def __init__(self) -> None:
        self.modules: dict[tuple, Any] = {}

    def get(self, entry: str, **defines: int) -> Any:
        from pycuda.compiler import SourceModule
        key = tuple(sorted(defines.items()))
        if key not in self.modules:
            options = [f"-D{name}={value}" for name, value in key]
            with device.thread_context():
                self.modules[key] = SourceModule((HERE / "wide.cu").read_text(),
                                                 no_extern_c=True, arch="sm_90",
                                                 include_dirs=[str(HERE)], options=options)
        return self.modules[key].get_function(entry)


def blocks(fn: Any, shared: int, warps: int, b: int, grid: str) -> int:
    """B for a row a block, else as many blocks as the SMs hold at once (at most B)."""
    fn.set_attribute(device.cuda().function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
    per_sm = max(1, min(SM_SHARED // (shared + 1024), 2048 // (32 * warps),
                        65536 // (32 * warps * max(fn.num_regs, 1))))
    return b if grid == "rows" else min(b, per_sm * device.sm_count())


def point(run: Callable[[], None], outputs: Callable[[], tuple], want: tuple, f32: tuple,
          names: tuple, **fields: Any) -> dict[str, Any]:
    """One variant's checks, rerun and time."""
    run()
    first = outputs()
    run()
    again = outputs()
    return {**fields,
            "checks": {n: compare(g, w, f) for n, g, w, f in zip(names, first, want, f32)},
            "rerun_bitwise": all(a.tobytes() == g.tobytes() for a, g in zip(again, first)),
            "us": gpu_time_us(run)["median_us"]}


def say(pass_: str, shape: tuple, p: dict, library_us: float, floor_us: float) -> None:
    print(pass_, *shape, p["WARPS"], p["KC"], p["grid"], "%.1f us" % p["us"],
          "(library %.1f, floor %.1f)" % (library_us, floor_us),
          "rel err %.2e" % max(c["max_rel_err"] for c in p["checks"].values()),
          "passes" if all(c["passed"] for c in p["checks"].values()) else "FAILS",
          "bitwise" if p["rerun_bitwise"] else "NOT BITWISE", flush=True)


def mma_rate(variants: Variants) -> dict[str, float]:
    """mma.sync m16n8k8 TF32's rate on this GPU (wide.cu's mma_rate: 8 warps a block, 4 blocks
    an SM, 8 independent accumulations a round)."""
    fn, iters = variants.get("mma_rate", RATE=1), 4096
    grid = 4 * device.sm_count()
    out = ga.empty((grid * 256,), np.float32)
    us = gpu_time_us(lambda: fn(out.gpudata, np.int32(iters), grid=(grid, 1, 1),
                                block=(256, 1, 1)))["median_us"]
    flops = grid * 8 * iters * 8 * 2 * 16 * 8 * 8
    return {"us": us, "tflops": flops / us / 1e6}


def main(out: str, versions: set[str]) -> None:
    bandwidth = CudaHarness().copy_bandwidth_gbps()
    rng = np.random.default_rng(0)
    record = {"what": __doc__.split("\n")[0], "commit": git_state()["describe"],
              "gpu": device.gpu_name(), "copy_bandwidth_GBps": round(bandwidth, 1), "shapes": []}
    variants = Variants()
    if "rate" in versions:
        record["mma_rate"] = mma_rate(variants)
        print("mma.sync m16n8k8 tf32: %.0f TFLOPS (3xTF32: %.0f)"
              % (record["mma_rate"]["tflops"], record["mma_rate"]["tflops"] / 3), flush=True)
    for h, d, b, k in SHAPES:
        if "first" not in versions and not (rows_fit(h, d, 0) or dsplit_points(h, d)
                                            or whole_points(h, d, k)):
            continue
        q = rng.standard_normal((h, d)).astype(np.float32)
        ln = rng.standard_normal((b, k, d)).astype(np.float32)
        grad_ctx = rng.standard_normal((b, h, d)).astype(np.float32)
        want_fwd = ref.pool_forward(q, ln)
        f32_fwd = ref.pool_forward(q, ln, dtype=np.float32)
        attn, ctx = want_fwd[1].astype(np.float32), want_fwd[0].astype(np.float32)
        want_bwd = ref.pool_backward(q, ln, attn, grad_ctx)
        f32_bwd = ref.pool_backward(q, ln, attn, grad_ctx, dtype=np.float32)
        d_q, d_ln, d_attn, d_ctx, d_g = map(ga.to_gpu, (q, ln, attn, ctx, grad_ctx))
        lib = PerHorizonAttentionPool(h, d)
        lib.forward(d_q, d_ln)
        lib.backward(d_q, d_ln, d_attn, d_g, d_ctx)
        floor = {"forward": 4 * (b * k * d + b * h * k + b * h * d) / bandwidth / 1e3,
                 "backward": 4 * (2 * b * k * d + b * h * k + 2 * b * h * d) / bandwidth / 1e3}
        library = {"params": {r: c["params"] for r, c in lib.chosen.items()},
                   "forward_us": gpu_time_us(lambda: lib.forward(d_q, d_ln))["median_us"],
                   "backward_us": gpu_time_us(
                       lambda: lib.backward(d_q, d_ln, d_attn, d_g, d_ctx))["median_us"]}
        entry = {"H": h, "D": d, "B": b, "K": k, "floor_us": floor, "library": library,
                 "forward": [], "backward": []}
        scale = np.float32(1 / np.sqrt(d))

        def forward(fn: Any, warps: int, floats: int, grid: str, **fields: Any) -> None:
            """One forward variant: checked, rerun, timed, said, kept."""
            n = blocks(fn, 4 * floats, warps, b, grid)
            o_ctx, o_attn = ga.empty((b, h, d), np.float32), ga.empty((b, h, k), np.float32)

            def run() -> None:
                fn(d_q.gpudata, d_ln.gpudata, o_ctx.gpudata, o_attn.gpudata, np.int32(b),
                   np.int32(k), scale, grid=(n, 1, 1), block=(32 * warps, 1, 1),
                   shared=4 * floats)
            p = point(run, lambda: (o_ctx.get(), o_attn.get()), want_fwd, f32_fwd,
                      ("ctx", "attn"), blocks=n, registers=fn.num_regs, WARPS=warps, grid=grid,
                      **fields)
            entry["forward"].append(p)
            say("fwd", (h, d, b, k), p, library["forward_us"], floor["forward"])

        def backward(fn: Any, warps: int, floats: int, grid: str, **fields: Any) -> None:
            """One backward variant (given ctx; grad_q_h through the library's reduce)."""
            n = blocks(fn, 4 * floats, warps, b, grid)
            o_gln, scratch = ga.empty((b, k, d), np.float32), ga.empty((n, h * d), np.float32)
            sums = []

            def run() -> None:
                fn(d_q.gpudata, d_ln.gpudata, d_attn.gpudata, d_g.gpudata, d_ctx.gpudata,
                   o_gln.gpudata, scratch.gpudata, np.int32(b), np.int32(k), scale,
                   grid=(n, 1, 1), block=(32 * warps, 1, 1), shared=4 * floats)
                sums[:] = [reducer().sum_rows(scratch, n, h * d, None, (h, d))]
            p = point(run, lambda: (sums[0].get(), o_gln.get()), want_bwd, f32_bwd,
                      ("grad_q_h", "grad_ln"), blocks=n, registers=fn.num_regs, WARPS=warps,
                      grid=grid, **fields)
            entry["backward"].append(p)
            say("bwd", (h, d, b, k), p, library["backward_us"], floor["backward"])

        def keep() -> None:  # after each point: a cut run keeps what it measured
            Path(out).write_text(json.dumps({**record, "shapes": [*record["shapes"], entry]},
                                            indent=1))

        for (kc, stages), grid in itertools.product(ROWS_POINTS if "rows" in versions else (),
                                                    GRIDS):
            sizes = {"N_HORIZONS": h, "HIDDEN_DIM": d, "KC": kc, "RSTAGES": stages}
            floats, warps = shared_floats("ROWS", k, **sizes), h // 16
            if not rows_fit(h, d, floats):
                continue
            fields = {"KC": kc, "RSTAGES": stages, "version": "rows"}
            forward(variants.get("wide_forward_rows", ROWS=1, **sizes), warps, floats, grid,
                    **fields)
            floats = shared_floats("ROWS_BWD", **sizes)
            if kc % (16 * warps) == 0 and rows_fit(h, d, floats):
                backward(variants.get("wide_backward_rows", ROWS=1, **sizes), warps, floats,
                         grid, **fields)
            keep()
        for (dc, stages), grid in itertools.product(
                dsplit_points(h, d) if "dsplit" in versions else (), GRIDS):
            sizes = {"N_HORIZONS": h, "HIDDEN_DIM": d, "DC": dc, "KC": 16, "RSTAGES": stages}
            fields = {"KC": 16, "RSTAGES": stages, "DC": dc, "version": "dsplit"}
            floats = shared_floats("DSPLIT", k, **sizes)
            if 4 * floats <= device.max_shared_bytes():
                forward(variants.get("wide_forward_dsplit", DSPLIT=1, **sizes), d // dc, floats,
                        grid, **fields)
            floats = shared_floats("DSPLIT_BWD", **sizes)
            if 4 * floats <= device.max_shared_bytes():
                backward(variants.get("wide_backward_dsplit", DSPLIT=1, **sizes), d // dc, floats,
                         grid, **fields)
            keep()
        for sizes, grid in itertools.product(
                whole_points(h, d, k) if "whole" in versions else (), GRIDS):
            fields = {"KC": sizes["KMAX"], "SNS": sizes["SNS"], "GN": sizes["GN"],
                      "QG": sizes["QG"], "version": "whole"}
            forward(variants.get("wide_forward_whole", WHOLE=1, **sizes), sizes["WARPS"],
                    SIZES.value("WHOLE_FLOATS", sizes), grid, **fields)
            backward(variants.get("wide_backward_whole", WHOLE=1, **sizes), sizes["WARPS"],
                     SIZES.value("WHOLE_BWD_FLOATS", sizes), grid, **fields)
            keep()
        for (warps, kc), grid in itertools.product(POINTS if "first" in versions else (), GRIDS):
            sizes = first_versions(h, d, warps, kc)
            floats = shared_floats("WIDE", k, **sizes)
            if fits(h, d, warps, kc, floats, False):
                forward(variants.get("wide_forward", **sizes), warps, floats, grid, KC=kc)
            floats = shared_floats("WIDE_BWD", **sizes)
            if fits(h, d, warps, kc, floats, True):
                backward(variants.get("wide_backward", **sizes), warps, floats, grid, KC=kc)
        record["shapes"].append(entry)
        Path(out).write_text(json.dumps(record, indent=1))  # after each shape: a cut run keeps it


if __name__ == "__main__":
    main(sys.argv[1], set(sys.argv[2:]) or set(VERSIONS))
