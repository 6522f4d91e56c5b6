"""Issue 32 probe: FrdHead's whole forward in one launch on FP16 pieces (fused_fp16.cu) against
float64 and the library's forward and forward_loss at their shipped launches, in the same run,
at B = 65536, 16384, 1024 and 333 (a short last tile, checked only). Each output (hidden,
logits; with the loss grad_logits and ce) is poisoned with NaN, checked against float64 by the
library's rule (``verify.checks.compare``), and rerun bitwise; a variant that fails is not timed.
Each variant runs in a process of its own (run.py's ``isolated``): a wrong fragment layout can
fault.

    source .gpu/env.sh && python probes/frdhead_wgmma/fused_fp16.py $OUT/frd_fused_fp16.json
    python probes/frdhead_wgmma/fused_fp16.py --nvcc      (CPU: compile each variant, ptxas's
                                                           report, no GPU)
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from pycuda_heads import reference as ref
from pycuda_heads.core.compile import NVCC_OPTIONS, WGMMA_ARCH
from pycuda_heads.core.source import render

HERE = Path(__file__).resolve().parent
D = F = 128
H, A = 5, 21
BATCHES = (65536, 16384, 1024, 333)
# the family's constants and the forward knobs the shipped WGMMA launch uses (its sizes, its
# staging); BM and CHUNK are the mma.sync entries', which compile beside it
FAMILY = {"D_IN": D, "FRD_HIDDEN": F, "N_HORIZONS": H, "N_ATOMS": A, "BM": 32, "CHUNK": 256,
          "WGMMA": 1, "WG": 2, "CS": 4, "SWZ": 1}
WG = FAMILY["WG"]
# the weights' FP16 pieces, their rows' inverse scales and the biases, then per warpgroup a row
# buffer (SWZ 1: unpadded) and 4 warps' staged logits rows
SHARED = (2 * 2 * (F * D + 112 * F) + 4 * 2 * (F + 112)
          + 4 * WG * (64 * D + 4 * 8 * H * A))
assert FAMILY["SWZ"] == 1, "SHARED counts unpadded row buffers"
VARIANTS = {"fused_forward": 0, "fused_forward_loss": 1}


def source(loss: int) -> str:
    return (render("frdhead", FAMILY) + f"\n#define FUSED_LOSS {loss}\n"
            + (HERE / "fused_fp16.cu").read_text())


def nvcc_report() -> None:
    """Each variant through nvcc for sm_90a: errors, registers, spills (no GPU)."""
    for name, loss in VARIANTS.items():
        with tempfile.TemporaryDirectory() as tmp:
            cu = Path(tmp) / "v.cu"
            cu.write_text(source(loss))
            proc = subprocess.run(
                ["nvcc", *NVCC_OPTIONS, "-cubin", "-Xptxas", "-v", f"-I{HERE}",
                 "-gencode=arch=compute_90a,code=sm_90a", "-o", str(Path(tmp) / "v.cubin"),
                 str(cu)], capture_output=True, text=True)
        lines = proc.stderr.splitlines()
        at = next((i for i, s in enumerate(lines) if "'fused_forward_f16'" in s), None)
        print(f"{name}: nvcc rc {proc.returncode}",
              *(lines[at + 2:at + 4] if at is not None else
                [s for s in lines if "error" in s][:5]), sep="\n  ")


def variant(name: str) -> dict:
    import pycuda.gpuarray as ga
    from pycuda.compiler import SourceModule

    import engine  # beside this file
    from pycuda_heads.core import device
    from pycuda_heads.perf.timing import gpu_time_us
    from pycuda_heads.verify.checks import compare

    loss = VARIANTS[name]
    with device.thread_context():
        fn = SourceModule(source(loss), no_extern_c=True, arch=WGMMA_ARCH,
                          include_dirs=[str(HERE)], options=list(NVCC_OPTIONS)
                          ).get_function("fused_forward_f16")
    fn.set_attribute(device.cuda().function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, SHARED)
    out = {"registers": fn.num_regs, "shared_bytes": SHARED, "batches": {}}
    for b in BATCHES:
        x = engine.inputs(b)
        host = {k: v.get() for k, v in x.items()}
        r64 = ref.frdhead_forward(*(host[n] for n in ("h_t", "w1", "b1", "w2", "b2")))
        r32 = ref.frdhead_forward(*(host[n] for n in ("h_t", "w1", "b1", "w2", "b2")),
                                  dtype=np.float32)
        refs = {"hidden": (r64[0], r32[0]), "logits": (r64[1], r32[1])}
        if loss:
            g64, ce64 = ref.frd_softmax_ce_grad(r64[1], host["labels"])
            g32, ce32 = ref.frd_softmax_ce_grad(r32[1], host["labels"], dtype=np.float32)
            refs.update(grad_logits=(g64, g32), ce=(ce64, ce32))
        outs = {"hidden": ga.empty((b, F), np.float32), "logits": ga.empty((b, H, A), np.float32),
                "grad_logits": ga.empty((b, H, A), np.float32), "ce": ga.empty((b, H), np.float32)}
        grid = (min(device.sm_count(), -(-b // (64 * WG))), 1, 1)

        def run() -> None:
            fn(*(x[n].gpudata for n in ("h_t", "w1", "b1", "w2", "b2", "labels")),
               *(o.gpudata for o in outs.values()), np.int32(b), np.float32(1.0 / b),
               grid=grid, block=(128 * WG, 1, 1), shared=SHARED)
        for o in outs.values():
            o.fill(np.float32(np.nan))
        run()
        first = {k: outs[k].get() for k in refs}
        run()
        checks = {k: compare(first[k], *refs[k]) for k in refs}
        point = {"checks": checks,
                 "rerun_bitwise": all(first[k].tobytes() == outs[k].get().tobytes()
                                      for k in refs)}
        point["good"] = point["rerun_bitwise"] and all(c["passed"] for c in checks.values())
        if b != BATCHES[-1] and point["good"]:
            point["us"] = gpu_time_us(run)["median_us"]
        out["batches"][b] = point
    return out


def peers() -> dict:
    """The library's forward and forward_loss at their shipped launches, per timed batch."""
    import engine
    import pycuda_heads as ph
    from pycuda_heads.perf.timing import gpu_time_us

    head, out = ph.FrdHead(D, F, H, A), {}
    for b in BATCHES[:-1]:
        x = engine.inputs(b)
        args = [x[n] for n in ("h_t", "w1", "b1", "w2", "b2")]
        out[b] = {"library_forward_us": gpu_time_us(lambda: head.forward(*args))["median_us"],
                  "library_forward_loss_us": gpu_time_us(
                      lambda: head.forward_loss(*args, x["labels"]))["median_us"]}
    return out


def main(path: str) -> None:
    from pycuda_heads.core import device
    from run import isolated  # beside this file

    device.cuda()
    record = {"what": __doc__.split("\n")[0], "peers": peers(), "variants": {}}
    print(record["peers"], flush=True)
    for name in VARIANTS:
        record["variants"][name] = got = isolated(__file__, path, name)
        for b, point in got.get("batches", {}).items():
            print(b, name, "passes" if point["good"] else "FAILS",
                  {k: "%.1e" % c["max_rel_err"] for k, c in point["checks"].items()},
                  "%.1f us" % point["us"] if "us" in point else "", flush=True)
        Path(path).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    if sys.argv[1:] == ["--nvcc"]:
        nvcc_report()
    elif len(sys.argv) == 4 and sys.argv[2] == "--variant":
        Path(sys.argv[1]).write_text(json.dumps(variant(sys.argv[3])))
    else:
        main(sys.argv[1])
