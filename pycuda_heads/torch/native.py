"""The C++ launcher (``native.cpp``): launch programs replayed and autograd nodes made without
the interpreter, built once per source and torch version by torch's extension builder into
the pycuda-heads cache. Where it cannot be built (no C++ compiler, ninja or CUDA's ``cuda.h``)
or ``PYCUDA_HEADS_NATIVE=0`` turns it off, the Python launcher in ``launch.py`` runs the same
programs, and one warning says why."""
from __future__ import annotations

import hashlib
import os
import shutil
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from ..core.compile import cache_dir

SOURCE = Path(__file__).with_name("native.cpp")


def cuda_include() -> Path | None:
    """The folder holding the CUDA driver API's ``cuda.h``: under $CUDA_HOME, $CUDA_PATH, the
    toolkit of the ``nvcc`` on the PATH, or /usr/local/cuda."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(str(Path(nvcc).resolve().parent.parent))
    roots.append("/usr/local/cuda")
    for root in filter(None, roots):
        if (Path(root) / "include" / "cuda.h").is_file():
            return Path(root) / "include"
    return None


def build() -> Any:
    """Build (or load from the cache) the extension module; raises what the build raised."""
    from torch.utils import cpp_extension
    include = cuda_include()
    if include is None:
        raise RuntimeError("no cuda.h found (set CUDA_HOME to the CUDA toolkit)")
    tag = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode()).hexdigest()[:12]
    folder = cache_dir(f"native/{tag}")
    # a CUDA build of torch hands its current stream over in C++ (linked to c10_cuda)
    with_cuda = torch.version.cuda is not None
    return cpp_extension.load(f"pycuda_heads_native_{tag}", [str(SOURCE)],
                              extra_include_paths=[str(include)],
                              extra_cflags=["-O2", *(["-DPYCUDA_HEADS_TORCH_CUDA"]
                                                     if with_cuda else [])],
                              extra_ldflags=["-ldl"], with_cuda=with_cuda,
                              build_directory=str(folder), verbose=False)


@lru_cache(maxsize=None)
def native() -> Any | None:
    """The built launcher, or None (turned off, no CUDA device, or the build failed: warned
    once)."""
    if os.environ.get("PYCUDA_HEADS_NATIVE", "1") == "0" or not torch.cuda.is_available():
        return None  # turned off, or nothing to launch on
    try:
        module = build()
    except Exception as exc:  # any build failure leaves the Python launcher working
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        warnings.warn(f"pycuda_heads.torch: the C++ launcher could not be built ({reason}); "
                      "calls take the slower Python launcher (PYCUDA_HEADS_NATIVE=0 skips "
                      "the build)", RuntimeWarning, stacklevel=2)
        return None
    return module
