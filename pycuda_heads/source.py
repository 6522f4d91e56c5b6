"""Kernel sources: where the .cu files live and how a variant's source is rendered.

A variant is (kernel family, constants): the family names ``cu/<family>.cu``; the constants
(template constants such as N_HORIZONS and launch knobs such as BLOCK) become a ``#define``
prelude. The shared header is inlined, so the rendered text is self-contained: it is what
SourceModule compiles on the GPU and what the static check compiles with plain nvcc.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

COMMON_HEADER = "heads_common.cuh"
_INCLUDE = f'#include "{COMMON_HEADER}"'
FAMILIES = ("per_horizon_attention_pool", "per_horizon_residual", "alpha_gate",
            "frd_softmax_ce_grad", "reduce_axis0", "timing_spin")


def cu_dir() -> Path:
    """The folder holding the .cu sources: inside the installed package, else the checkout's cu/."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "cu", here.parent / "cu"):
        if (candidate / COMMON_HEADER).is_file():
            return candidate
    raise FileNotFoundError(f"pycuda-heads: no CUDA sources found in {here / 'cu'} or "
                            f"{here.parent / 'cu'}; the installation is incomplete")


@lru_cache(maxsize=None)
def _read(name: str) -> str:
    return (cu_dir() / name).read_text()


def render(family: str, constants: Mapping[str, Any]) -> str:
    """Self-contained CUDA source of one variant."""
    if family not in FAMILIES:
        raise ValueError(f"unknown kernel family {family!r}; expected one of {FAMILIES}")
    prelude = "".join(f"#define {k} {int(v)}\n" for k, v in sorted(constants.items()))
    body = _read(f"{family}.cu").replace(_INCLUDE, _read(COMMON_HEADER))
    return f"// pycuda-heads variant of {family}\n{prelude}{body}"


def variant_hash(source: str, options: tuple[str, ...] = ()) -> str:
    """Stable identity of a compiled variant: its rendered source and compiler options."""
    return hashlib.sha256("\0".join((source, *options)).encode()).hexdigest()[:16]


def sources_hash() -> str:
    """Hash of every kernel source file; the validation record is tied to it."""
    h = hashlib.sha256()
    for path in sorted(cu_dir().glob("*.cu*")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]
