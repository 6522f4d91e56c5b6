"""Compiling many kernel variants before timing, in parallel processes: each child runs
``pycuda.compiler.compile`` with the options and architecture ``SourceModule`` will use, which
fills PyCUDA's disk cache, so loading each variant in the timing process costs no nvcc run."""
from __future__ import annotations

import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Iterable

from pycuda_heads.compile import NVCC_OPTIONS

log = logging.getLogger("pycuda_heads.tuning")


def compile_source(source: str, arch: str) -> str | None:
    """Compile one rendered source into PyCUDA's disk cache; the error text when it fails."""
    from pycuda.compiler import compile as nvcc_compile
    try:
        nvcc_compile(source, no_extern_c=True, options=list(NVCC_OPTIONS), arch=arch)
    except Exception as exc:  # reported; the timing step records the failure as ERROR
        return f"{type(exc).__name__}: {exc}"
    return None


def compile_all(sources: Iterable[str], arch: str, workers: int) -> int:
    """Compile every distinct source; returns how many failed."""
    unique = list(dict.fromkeys(sources))
    if not unique:
        return 0
    # spawn: the parent holds a CUDA context, which a forked child must not inherit
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(1, workers), mp_context=context) as pool:
        errors = list(pool.map(compile_source, unique, [arch] * len(unique)))
    failed = [e for e in errors if e]
    for error in failed[:3]:
        log.warning("precompile failed: %s", error[:500])
    log.info("compiled %d variants (%d failed)", len(unique), len(failed))
    return len(failed)
