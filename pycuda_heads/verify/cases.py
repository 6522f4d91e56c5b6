"""One kernel variant at one shape on fixed random inputs (never zeros): its launch as training
uses it, and its references in float64 and float32. The GPU tests, the tuner and the validation
record all go through these. Device inputs are made once per (kernel, template, shape, seed)
and shared by every variant timed or checked on them."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Mapping

import numpy as np

from ..catalog import SUITE_TEMPLATE
from ..core.spec import KernelSpec

# The newest Inputs by (kernel, template, shape, seed): a tuning task's rotation of input sets
# and the validation of its candidates all fit.
_INPUTS: OrderedDict[tuple, "Inputs"] = OrderedDict()
_KEEP = 6


class Inputs:
    """Host inputs of a kernel at one shape, their device copies (uploaded on first use) and
    their references (computed on first use)."""

    def __init__(self, spec: KernelSpec, template: Mapping[str, int], shape: Mapping[str, int],
                 seed: int):
        self.spec = spec
        self.host = spec.make_inputs(template, shape, seed)
        self._dev: dict[str, Any] | None = None
        self._refs: dict[str, tuple[np.ndarray, ...]] = {}

    @property
    def dev(self) -> dict[str, Any]:
        if self._dev is None:
            import pycuda.gpuarray as gpuarray

            from ..core.device import allocator
            self._dev = {n: gpuarray.to_gpu(v, allocator=allocator()) for n, v in self.host.items()}
        return self._dev

    def reference(self, dtype: type = np.float64) -> tuple[np.ndarray, ...]:
        name = np.dtype(dtype).name
        if name not in self._refs:
            self._refs[name] = self.spec.run_reference(self.host, dtype)
        return self._refs[name]


def shared_inputs(spec: KernelSpec, template: Mapping[str, int], shape: Mapping[str, int],
                  seed: int = 0) -> Inputs:
    """The one ``Inputs`` of this point, made on first use and shared by every variant."""
    key = (spec.id, tuple(sorted(template.items())), tuple(sorted(shape.items())), seed)
    hit = _INPUTS.get(key)
    if hit is None or hit.spec is not spec:
        hit = _INPUTS[key] = Inputs(spec, template, shape, seed)
        while len(_INPUTS) > _KEEP:
            _INPUTS.popitem(last=False)
    _INPUTS.move_to_end(key)
    return hit


class Case:
    """One kernel variant at one shape (needs a GPU)."""

    def __init__(self, spec: KernelSpec, shape: Mapping[str, int], params: Mapping[str, Any],
                 template: Mapping[str, int] | None = None, seed: int = 0):
        self.spec, self.shape, self.seed = spec, dict(shape), seed
        self.template = spec.template(template or SUITE_TEMPLATE)
        self.params = spec.space.complete(params, self.template)
        self.op = spec.make_op(self.template, self.params)
        self.inputs = shared_inputs(spec, self.template, self.shape, seed)
        self.floor_bytes = spec.floor_bytes(self.template, self.shape)

    def launch(self) -> tuple[Any, ...]:
        """Launch the kernel once as training uses it; the device outputs."""
        return self.spec.call(self.op, self.inputs.dev)

    def reference(self, dtype: type = np.float64) -> tuple[np.ndarray, ...]:
        return self.inputs.reference(dtype)
