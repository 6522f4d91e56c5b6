"""What one study tunes: a kernel, its template constants, a problem shape, on one GPU."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from pycuda_heads.space import KernelSpace

from .spaces import dims_key


@dataclass(frozen=True)
class TuningTask:
    kernel: str
    space: KernelSpace
    template: Mapping[str, int]
    shape: Mapping[str, int]
    gpu: str
    slug: str
    #: kernel family (the .cu file); empty for synthetic spaces in tests
    family: str = ""
    #: identity of the kernel sources: a change starts a fresh cache and study
    source_hash: str = ""

    @classmethod
    def from_registry(cls, kernel: str, shape: Mapping[str, int], gpu: str, slug: str,
                      template: Mapping[str, int] | None = None) -> "TuningTask":
        from pycuda_heads.registry import KERNELS
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel {kernel!r}; expected one of {sorted(KERNELS)}")
        info = KERNELS[kernel]
        return cls(kernel=kernel, space=info.space, template=info.template(template),
                   shape={k: int(v) for k, v in shape.items()}, gpu=gpu, slug=slug,
                   family=info.family, source_hash=family_source_hash(info.family))

    @property
    def name(self) -> str:
        """File-name stem: '<kernel>__<template>__<shape>'."""
        return f"{self.kernel}__{dims_key(self.template)}__{dims_key(self.shape)}"

    @property
    def study_name(self) -> str:
        base = f"{self.slug}:{self.kernel}:{dims_key(self.template)}:{dims_key(self.shape)}"
        return f"{base}:{self.source_hash}" if self.source_hash else base

    def label(self) -> str:
        return f"{self.kernel} {dims_key(self.shape)}"


def family_source_hash(family: str) -> str:
    """Hash of a family's rendered source (shared header inlined) and the compiler options."""
    from pycuda_heads.compile import NVCC_OPTIONS
    from pycuda_heads.source import render, variant_hash
    return variant_hash(render(family, {}), NVCC_OPTIONS)
