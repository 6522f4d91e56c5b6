"""Test cases per kernel: random inputs at a shape (never zeros), one launch as the kernel is used
in training, its references in float64 and float32, and its floor bytes. The GPU tests, the tuner
and the validation record all go through these."""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping

import numpy as np

from . import reference as ref
from .floor import floor_bytes
from .registry import KERNELS, SUITE_TEMPLATE

F32 = np.float32


def op_kwargs(kernel: str, template: Mapping[str, int]) -> dict[str, int]:
    """Constructor arguments of the op behind ``kernel`` from its template constants."""
    names = {"N_HORIZONS": "n_horizons", "HIDDEN_DIM": "hidden_dim", "N_ATOMS": "n_atoms"}
    return {names[k]: int(v) for k, v in template.items()}


def make_inputs(kernel: str, template: Mapping[str, int], shape: Mapping[str, int],
                seed: int) -> dict[str, np.ndarray]:
    """Host inputs of ``kernel`` (shared and cached: callers must not modify them)."""
    return _inputs(kernel, tuple(sorted(template.items())), tuple(sorted(shape.items())), seed)


@lru_cache(maxsize=4)
def _inputs(kernel: str, template_items: tuple, shape_items: tuple,
            seed: int) -> dict[str, np.ndarray]:
    """Standard normal draws, uniform gates in [-2, 2], mixed FRD labels."""
    template, shape = dict(template_items), dict(shape_items)
    rng = np.random.default_rng(seed)
    h, d = template.get("N_HORIZONS", 1), template.get("HIDDEN_DIM", 1)
    b, k = shape.get("B", 1), shape.get("K", 1)

    def normal(*dims: int) -> np.ndarray:
        return rng.standard_normal(dims, dtype=F32)

    family = kernel.split(".")[0]
    if family == "pool":
        x = {"q_h": normal(h, d), "ln": normal(b, k, d)}
        if kernel == "pool.backward":
            x["attn"] = ref.pool_forward(x["q_h"], x["ln"])[1].astype(F32)
            x["grad_ctx"] = normal(b, h, d)
        return x
    if family == "residual":
        x = {"ctx": normal(b, h, d), "w_res": normal(h, d)}
        if kernel == "residual.forward":
            x["bias_res"] = normal(h)
        else:
            x["grad_residual"] = normal(b, h)
        return x
    if family == "gate":
        x = {"residual": normal(b, h), "alpha": rng.uniform(-2, 2, h).astype(F32)}
        if kernel == "gate.forward":
            x["head"] = normal(b, h)
        else:
            x["grad_out"] = normal(b, h)
        return x
    if kernel == "frd.softmax_ce_grad":
        return frd_inputs(rng, b, h, template["N_ATOMS"])
    if kernel == "reduce_axis0":
        return {"x": normal(shape["N"], shape["M"])}
    raise KeyError(kernel)


def frd_inputs(rng: np.random.Generator, b: int, h: int, a: int) -> dict[str, np.ndarray]:
    """Logits N(0, 3^2) with a few extreme rows (+-1e4 spreads, all equal, one huge) and labels
    covering -1, 0 and N_ATOMS-1; about one row in ten is a sentinel."""
    logits = (3 * rng.standard_normal((b, h, a))).astype(F32)
    labels = rng.integers(0, a, size=(b, h)).astype(np.int32)
    labels[rng.random((b, h)) < 0.1] = -1
    flat_l, flat_x = labels.reshape(-1), logits.reshape(-1, a)
    specials = [-1, 0, a - 1]
    flat_l[: min(len(flat_l), 3)] = specials[: len(flat_l)]
    rows = len(flat_x)
    if rows >= 4:
        flat_x[rows // 4] = rng.choice([-1e4, 1e4], size=a)
        flat_x[rows // 2] = 0.5
        flat_x[3 * rows // 4, rng.integers(a)] = 1e4
    return {"logits": logits, "labels": labels}


class Case:
    """One kernel variant at one shape on fixed random inputs (needs a GPU)."""

    def __init__(self, kernel: str, shape: Mapping[str, int], params: Mapping[str, Any],
                 template: Mapping[str, int] | None = None, seed: int = 0):
        import pycuda.gpuarray as gpuarray

        from .device import allocator
        self.info = KERNELS[kernel]
        self.kernel, self.shape, self.seed = kernel, dict(shape), seed
        self.template = self.info.template(template or SUITE_TEMPLATE)
        self.params = self.info.space.complete(params)
        launch = {self.info.role: self.params}
        self.op = self.info.op(**op_kwargs(kernel, self.template), launch=launch)
        self.host = make_inputs(kernel, self.template, self.shape, seed)
        self.dev = {n: gpuarray.to_gpu(v, allocator=allocator()) for n, v in self.host.items()}
        self.floor_bytes = floor_bytes(kernel, self.template, self.shape)

    def launch(self) -> tuple[Any, ...]:
        """Launch the kernel once as training uses it; the device outputs."""
        x, op = self.dev, self.op
        calls = {
            "pool.forward": lambda: op.forward(x["q_h"], x["ln"]),
            "pool.backward": lambda: op.backward(x["q_h"], x["ln"], x["attn"], x["grad_ctx"]),
            "residual.forward": lambda: (op.forward(x["ctx"], x["w_res"], x["bias_res"]),),
            "residual.backward": lambda: op.backward(x["ctx"], x["w_res"], x["grad_residual"]),
            "gate.forward": lambda: (op.forward(x["head"], x["residual"], x["alpha"]),),
            "gate.backward": lambda: op.backward(x["residual"], x["alpha"], x["grad_out"]),
            # labels were drawn valid; the device label check is not part of the kernel
            "frd.softmax_ce_grad": lambda: op.softmax_ce_grad(x["logits"], x["labels"],
                                                              check_labels=False),
            "reduce_axis0": lambda: (op(x["x"]),),
        }
        return tuple(calls[self.kernel]())

    def output_names(self) -> tuple[str, ...]:
        return OUTPUTS[self.kernel]

    def validate(self) -> dict[str, Any]:
        """Every GPU check of this variant (``checks.validate_case``)."""
        from .checks import validate_case  # checks builds on cases
        return validate_case(self)

    def reference(self, dtype: type = np.float64) -> tuple[np.ndarray, ...]:
        return _reference(self.kernel, tuple(sorted(self.template.items())),
                          tuple(sorted(self.shape.items())), self.seed, np.dtype(dtype).name)


OUTPUTS = {
    "pool.forward": ("ctx", "attn"),
    "pool.backward": ("grad_q_h", "grad_ln"),
    "residual.forward": ("residual",),
    "residual.backward": ("grad_w_res", "grad_bias_res", "grad_ctx"),
    "gate.forward": ("out",),
    "gate.backward": ("grad_head", "grad_residual", "grad_alpha"),
    "frd.softmax_ce_grad": ("grad_logits", "ce"),
    "reduce_axis0": ("y",),
}


@lru_cache(maxsize=32)
def _reference(kernel: str, template: tuple, shape: tuple, seed: int,
               dtype: str) -> tuple[np.ndarray, ...]:
    """References are cached: the tuner checks many variants against the same inputs."""
    x = make_inputs(kernel, dict(template), dict(shape), seed)
    dt = np.dtype(dtype).type
    fn = {
        "pool.forward": lambda: ref.pool_forward(x["q_h"], x["ln"], dtype=dt),
        "pool.backward": lambda: ref.pool_backward(x["q_h"], x["ln"], x["attn"], x["grad_ctx"],
                                                   dtype=dt),
        "residual.forward": lambda: (ref.residual_forward(x["ctx"], x["w_res"], x["bias_res"],
                                                          dtype=dt),),
        "residual.backward": lambda: ref.residual_backward(x["ctx"], x["w_res"],
                                                           x["grad_residual"], dtype=dt),
        "gate.forward": lambda: (ref.gate_forward(x["head"], x["residual"], x["alpha"], dtype=dt),),
        "gate.backward": lambda: ref.gate_backward(x["residual"], x["alpha"], x["grad_out"],
                                                   dtype=dt),
        "frd.softmax_ce_grad": lambda: ref.frd_softmax_ce_grad(x["logits"], x["labels"], dtype=dt),
        "reduce_axis0": lambda: (ref.reduce_axis0(x["x"], dtype=dt),),
    }[kernel]
    return tuple(np.asarray(r) for r in fn())


def make_case(kernel: str, shape: Mapping[str, int], params: Mapping[str, Any],
              template: Mapping[str, int] | None = None, seed: int = 0) -> Case:
    return Case(kernel, shape, params, template, seed)
