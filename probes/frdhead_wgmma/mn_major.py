"""Issue 32 probe: a forward-staged FP16 weight read transposed (MN-major) by wgmma (mn_major.cu),
each descriptor reading in a process of its own (a wrong one may fault); exact integer sums.

    source .gpu/env.sh && python probes/frdhead_wgmma/mn_major.py $OUT/frd_mn_major.json
    python probes/frdhead_wgmma/mn_major.py --nvcc      (CPU: compile both, ptxas's report)
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from pycuda_heads.core.compile import NVCC_OPTIONS
from pycuda_heads.core.source import cu_dir

HERE = Path(__file__).resolve().parent
R, C = 112, 128
SHARED = 2 * R * C


def options(desc: int) -> list[str]:
    return [*NVCC_OPTIONS, f"-DDESC={desc}"]


def nvcc_report() -> None:
    for desc in (0, 1):
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run(["nvcc", *options(desc), "-cubin", "-Xptxas", "-v",
                                   f"-I{cu_dir()}", "-gencode=arch=compute_90a,code=sm_90a",
                                   "-o", f"{tmp}/v.cubin", str(HERE / "mn_major.cu")],
                                  capture_output=True, text=True)
        print(f"DESC {desc}: nvcc rc {proc.returncode}",
              *[s for s in proc.stderr.splitlines() if "registers" in s or "error" in s
                or "C75" in s], sep="\n  ")


def variant(desc: int) -> dict:
    import pycuda.gpuarray as ga
    from pycuda.compiler import SourceModule

    from pycuda_heads.core import device
    with device.thread_context():
        fn = SourceModule((HERE / "mn_major.cu").read_text(), no_extern_c=True, arch="sm_90a",
                          include_dirs=[str(cu_dir())], options=options(desc)
                          ).get_function("mn_major")
    rng = np.random.default_rng(5)
    w, x, a = (rng.integers(-4, 5, shape).astype(np.float32)
               for shape in ((R, C), (64, C), (64, R)))
    y1, y2 = ga.empty((64, R), np.float32), ga.empty((64, C), np.float32)
    y1.fill(np.float32(np.nan))
    y2.fill(np.float32(np.nan))
    fn(ga.to_gpu(w).gpudata, ga.to_gpu(x).gpudata, ga.to_gpu(a).gpudata, y1.gpudata, y2.gpudata,
       grid=(1, 1, 1), block=(128, 1, 1), shared=SHARED)
    got1, got2 = y1.get(), y2.get()
    return {"forward_exact": bool((got1 == x @ w.T).all()),
            "transposed_exact": bool((got2 == a @ w).all()),
            "transposed_max_err": float(np.nanmax(np.abs(got2 - a @ w))),
            "transposed_finite": bool(np.isfinite(got2).all())}


def main(path: str) -> None:
    from run import isolated  # beside this file
    record = {"what": __doc__.split("\n")[0], "variants": {}}
    for desc in (0, 1):
        record["variants"][f"desc{desc}"] = got = isolated(__file__, path, str(desc))
        print(f"DESC {desc}", got, flush=True)
    Path(path).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    if sys.argv[1:] == ["--nvcc"]:
        nvcc_report()
    elif len(sys.argv) == 4 and sys.argv[2] == "--variant":
        Path(sys.argv[1]).write_text(json.dumps(variant(int(sys.argv[3]))))
    else:
        main(sys.argv[1])
