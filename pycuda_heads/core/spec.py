"""The declaration of one kernel: everything the library, the checks, the benchmark and the
tuner need to know about it, written once beside its op (``pycuda_heads/ops/<family>.py``).

A kernel's id is ``<family>.<role>``: the family names the ``.cu`` file, the op module, the
bench op and the cache files; the role names the op method's launch parameters
(``launch={role: {...}}``) and the kernel entry ``<family>_<role>`` in the ``.cu`` file.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from .space import KernelSpace

Dims = Mapping[str, int]
# Axis letters bound by template constants; every other axis (B, K, N, M) comes from the shape.
TEMPLATE_AXES = {"H": "N_HORIZONS", "D": "HIDDEN_DIM", "A": "N_ATOMS", "I": "D_IN",
                 "F": "FRD_HIDDEN"}
Draw = Callable[[np.random.Generator, tuple, Dims], np.ndarray]


def normal(rng: np.random.Generator, shape: tuple, dims: Dims) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def softmax_rows(rng: np.random.Generator, shape: tuple, dims: Dims) -> np.ndarray:
    """Rows that are softmaxes of normal scores (a valid attention input)."""
    s = rng.standard_normal(shape, dtype=np.float32)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def uniform2(rng: np.random.Generator, shape: tuple, dims: Dims) -> np.ndarray:
    """Uniform in [-2, 2]: gate parameters from closed to well open, both signs."""
    return rng.uniform(-2, 2, shape).astype(np.float32)


def positive_small(rng: np.random.Generator, shape: tuple, dims: Dims) -> np.ndarray:
    """Squares of normal draws / 100: a running mean of squared gradients (Adam's v)."""
    return rng.standard_normal(shape, dtype=np.float32) ** 2 * np.float32(1e-2)


def draw_labels(rng: np.random.Generator, shape: tuple, dims: Mapping[str, int]) -> np.ndarray:
    """Labels uniform over the atoms, about one in ten the -1 sentinel; the first three rows
    are -1, 0 and N_ATOMS-1."""
    a = dims["A"]
    labels = rng.integers(0, a, size=shape).astype(np.int32)
    labels[rng.random(shape) < 0.1] = -1
    flat = labels.reshape(-1)
    specials = [-1, 0, a - 1][: len(flat)]
    flat[: len(specials)] = specials
    return labels



@dataclass(frozen=True)
class Tensor:
    """A kernel argument: its named axes, element type and how test inputs are drawn, or, with
    ``derive``, computed from the inputs read before it (an input that must agree with others,
    such as a forward output the backward is given)."""

    axes: tuple[str, ...]
    dtype: str = "float32"
    draw: Draw = normal
    derive: Callable[[Mapping[str, np.ndarray]], np.ndarray] | None = None

    def shape(self, dims: Dims) -> tuple[int, ...]:
        return tuple(int(dims[a]) for a in self.axes)

    def nbytes(self, dims: Dims) -> int:
        return math.prod(self.shape(dims)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class KernelSpec:
    """One kernel of one op.

    Its id ``<family>.<role>`` is its space's. ``method`` of ``op`` takes the ``reads`` tensors in order and returns the ``writes`` in
    order; ``reference`` (float64 NumPy, ``dtype=`` keyword) and ``peer`` (the same math in
    PyTorch, called as ``peer(torch, *reads)``) take and return the same. ``passthrough`` maps
    an output that is one of the inputs returned unchanged (it moves no bytes). ``oracles``
    are the kernel's own numerical-gradient and analytical checks, given a factory of ops with
    the variant's launch parameters.
    """

    op: type
    method: str
    space: KernelSpace
    template_keys: tuple[str, ...]
    tensors: Mapping[str, Tensor]
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    reference: Callable[..., Any]
    suite: tuple[Dims, ...]
    grid: tuple[tuple[Dims, Dims], ...] = ()
    peer: Callable[..., Any] | None = None
    oracles: Callable[[Callable[[Dims], Any], Dims], dict[str, dict[str, Any]]] | None = None
    call_kwargs: Mapping[str, Any] = field(default_factory=dict)
    passthrough: Mapping[str, str] = field(default_factory=dict)
    #: name of this kernel in the benchmark (the role unless the op is one fused pass)
    bench_pass: str = ""
    #: folder of the family's .cu file; None: the package's own sources
    source_dir: Path | None = None
    #: the matrix products the kernel computes, each (M, N, K) in axis letters; letters
    #: written together multiply ("HA" is H * A). 2 M N K floating-point operations each.
    products: tuple[tuple[str, str, str], ...] = ()
    #: the kernels this one does the work of in one launch (ids, in the order they would run)
    fuses: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        missing = [n for n in (*self.reads, *self.writes) if n not in self.tensors]
        if missing:
            raise ValueError(f"{self.id}: tensors {missing} are read or written but not declared")

    @property
    def id(self) -> str:
        """``<family>.<role>``, as its space declares it (the one place it is written)."""
        return self.space.kernel

    @property
    def family(self) -> str:
        return self.space.family

    @property
    def role(self) -> str:
        return self.space.role

    def entries(self, params: Mapping[str, Any]) -> tuple[str, ...]:
        """The entries a call at ``params`` launches (``Op.entries``)."""
        return self.op.entries(self.role, params)

    @property
    def pass_name(self) -> str:
        return self.bench_pass or self.role

    def template(self, constants: Dims) -> dict[str, int]:
        return {k: int(constants[k]) for k in self.template_keys}

    def suite_points(self, base: Dims) -> list[tuple[dict[str, int], dict[str, int]]]:
        """(template, shape) of every suite entry: an entry's template constants (a wide model
        size such as ``{"N_HORIZONS": 8, "HIDDEN_DIM": 512, "B": 1024, "K": 128}``) override
        ``base``; its other keys are the shape."""
        out = []
        for entry in self.suite:
            over = {k: v for k, v in entry.items() if k in self.template_keys}
            shape = {k: int(v) for k, v in entry.items() if k not in self.template_keys}
            out.append((self.template({**base, **over}), shape))
        return out

    def dims(self, template: Dims, shape: Dims) -> dict[str, int]:
        """Every axis letter's length at ``template`` and ``shape``."""
        out = {axis: int(template[key]) for axis, key in TEMPLATE_AXES.items() if key in template}
        out.update({k: int(v) for k, v in shape.items()})
        return out

    def floor_bytes(self, template: Dims, shape: Dims) -> int:
        """Bytes the kernel must move through device memory: each input read once, each output
        written once (a passed-through input is not written)."""
        dims = self.dims(template, shape)
        moved = [*self.reads, *(w for w in self.writes if w not in self.passthrough)]
        return sum(self.tensors[n].nbytes(dims) for n in moved)

    def flops(self, template: Dims, shape: Dims) -> int:
        """Floating-point operations of the declared products (0 where none is declared)."""
        dims = self.dims(template, shape)
        return sum(2 * math.prod(math.prod(dims[a] for a in axes) for axes in product)
                   for product in self.products)

    def make_inputs(self, template: Dims, shape: Dims, seed: int = 0) -> dict[str, np.ndarray]:
        """Random, never-zero inputs of this kernel. Each tensor is drawn from a generator
        seeded by (seed, its name), so kernels of one family see the same tensor by name; a
        derived tensor is computed from those read before it."""
        dims = self.dims(template, shape)
        out: dict[str, np.ndarray] = {}
        for name in self.reads:
            t = self.tensors[name]
            if t.derive is not None:
                value = t.derive(out)
            else:
                rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
                value = t.draw(rng, t.shape(dims), dims)
            out[name] = np.ascontiguousarray(value, dtype=t.dtype)
        return out

    def call(self, op: Any, inputs: Mapping[str, Any]) -> tuple[Any, ...]:
        """Run the kernel through ``op`` as training does; its outputs in ``writes`` order."""
        out = getattr(op, self.method)(*(inputs[n] for n in self.reads), **self.call_kwargs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def run_reference(self, inputs: Mapping[str, np.ndarray],
                      dtype: type = np.float64) -> tuple[np.ndarray, ...]:
        out = self.reference(*(inputs[n] for n in self.reads), dtype=dtype)
        return tuple(np.asarray(o) for o in (out if isinstance(out, tuple) else (out,)))

    def make_op(self, template: Dims, params: Mapping[str, Any] | None = None) -> Any:
        """The op at ``template`` with ``params`` as this kernel's launch (tuned or default
        when None)."""
        launch = None if params is None else {self.role: dict(params)}
        return self.op(**self.op.constructor_kwargs(self.template(template)), launch=launch)
