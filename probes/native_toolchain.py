"""Can this machine build a torch C++ extension at run time, and how long does it take?
Builds a one-function extension with torch.utils.cpp_extension.load_inline into a fresh
folder and prints the compiler, ninja, the CUDA headers and the build's wall time as JSON.

    source .gpu/env.sh && python probes/native_toolchain.py OUT.json
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

import torch
from torch.utils import cpp_extension


def main(out: str) -> None:
    record = {"torch": torch.__version__, "cxx": shutil.which("c++"), "ninja": shutil.which("ninja"),
              "cuda_home": cpp_extension.CUDA_HOME,
              "cuda_h": os.path.exists(os.path.join(cpp_extension.CUDA_HOME or "/nonexistent",
                                                    "include", "cuda.h"))}
    folder = tempfile.mkdtemp()
    t0 = time.perf_counter()
    try:
        module = cpp_extension.load_inline(
            "probe_ext", "int64_t twice(int64_t x) { return 2 * x; }", functions=["twice"],
            build_directory=folder, verbose=False)
        record["works"] = module.twice(21) == 42
    except Exception as exc:  # what a user would see
        record["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    record["build_s"] = round(time.perf_counter() - t0, 1)
    with open(out, "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
