"""One kernel variant at one shape on fixed random inputs (never zeros): its launch as training
uses it, and its references in float64 and float32. The GPU tests, the tuner and the validation
record all go through these. Device inputs are made once per (kernel, template, shape, seed)
and shared by every variant timed or checked on them."""
from __future__ import annotations

from collections import OrderedDict
from functools import lru_cache
from typing import Any, Mapping

import numpy as np

from ..catalog import SUITE_TEMPLATE
from ..core.spec import KernelSpec

_REFERENCES: OrderedDict[tuple, tuple[np.ndarray, ...]] = OrderedDict()


class Inputs:
    """Host inputs of a kernel at one shape and their device copies (uploaded on first use)."""

    def __init__(self, spec: KernelSpec, template: Mapping[str, int], shape: Mapping[str, int],
                 seed: int):
        self.key = (spec.id, tuple(sorted(template.items())), tuple(sorted(shape.items())), seed)
        self.spec, self.template, self.shape, self.seed = spec, dict(template), dict(shape), seed
        self.host = spec.make_inputs(template, shape, seed)
        self._dev: dict[str, Any] | None = None

    @property
    def dev(self) -> dict[str, Any]:
        if self._dev is None:
            import pycuda.gpuarray as gpuarray

            from ..core.device import allocator
            self._dev = {n: gpuarray.to_gpu(v, allocator=allocator()) for n, v in self.host.items()}
        return self._dev

    def reference(self, dtype: type = np.float64) -> tuple[np.ndarray, ...]:
        """The reference outputs (cached: many variants are checked on the same inputs)."""
        key = (*self.key, np.dtype(dtype).name)
        if key not in _REFERENCES:
            _REFERENCES[key] = self.spec.run_reference(self.host, dtype)
            while len(_REFERENCES) > 16:
                _REFERENCES.popitem(last=False)
        return _REFERENCES[key]


@lru_cache(maxsize=6)
def _inputs(key: "_Key", template: tuple, shape: tuple, seed: int) -> Inputs:
    return Inputs(key.spec, dict(template), dict(shape), seed)


def shared_inputs(spec: KernelSpec, template: Mapping[str, int], shape: Mapping[str, int],
                  seed: int = 0) -> Inputs:
    """The one ``Inputs`` of this point, made on first use."""
    return _inputs(_Key(spec), tuple(sorted(template.items())),
                   tuple(sorted(shape.items())), seed)


class _Key:
    """A spec as a cache key by identity (specs hold dicts, so they are not hashable)."""

    def __init__(self, spec: KernelSpec):
        self.spec = spec

    def __hash__(self) -> int:
        return id(self.spec)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and other.spec is self.spec


class Case:
    """One kernel variant at one shape (needs a GPU)."""

    def __init__(self, spec: KernelSpec, shape: Mapping[str, int], params: Mapping[str, Any],
                 template: Mapping[str, int] | None = None, seed: int = 0):
        self.spec, self.shape, self.seed = spec, dict(shape), seed
        self.template = spec.template(template or SUITE_TEMPLATE)
        self.params = spec.space.complete(params)
        self.op = spec.make_op(self.template, self.params)
        self.inputs = shared_inputs(spec, self.template, self.shape, seed)
        self.floor_bytes = spec.floor_bytes(self.template, self.shape)

    def launch(self) -> tuple[Any, ...]:
        """Launch the kernel once as training uses it; the device outputs."""
        return self.spec.call(self.op, self.inputs.dev)

    def reference(self, dtype: type = np.float64) -> tuple[np.ndarray, ...]:
        return self.inputs.reference(dtype)
