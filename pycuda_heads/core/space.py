"""Launch-parameter search spaces: the knobs of one kernel, their values and restrictions.

Restrictions are plain Python expressions (Kernel Tuner style) evaluated over the knobs, the
template constants (N_HORIZONS, HIDDEN_DIM, N_ATOMS) and, for launch restrictions, the problem
shape (B, K), the device limit MAX_SHARED_BYTES and the derived SHARED_BYTES of the point.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

Point = dict[str, Any]

# Largest opt-in dynamic shared memory per block on sm_90 (227 KiB).
SM90_MAX_SHARED_BYTES = 227 * 1024


@dataclass(frozen=True)
class KernelSpace:
    """The tunable launch parameters of one kernel (for example ``pool.forward``)."""

    kernel: str
    params: Mapping[str, tuple]
    default: Mapping[str, Any]
    restrictions: tuple[str, ...] = ()
    launch_restrictions: tuple[str, ...] = ()
    shared_bytes: Callable[[Mapping[str, Any], Mapping[str, Any]], int] | None = field(
        default=None, compare=False)

    def __post_init__(self) -> None:
        unknown = set(self.default) ^ set(self.params)
        if unknown:
            raise ValueError(f"{self.kernel}: default and params disagree on {sorted(unknown)}")

    def violated(self, point: Mapping[str, Any], env: Mapping[str, Any],
                 shape: Mapping[str, Any] | None = None) -> str | None:
        """The first restriction ``point`` breaks (as written), or None when it is valid.

        ``env`` holds the template constants; with ``shape`` the launch restrictions apply too.
        """
        names = {**env, **point}
        for expr in self.restrictions:
            if not eval(expr, {"__builtins__": {}}, names):  # noqa: S307 - our own expressions
                return expr
        if shape is None:
            return None
        names.update(shape)
        names.setdefault("MAX_SHARED_BYTES", SM90_MAX_SHARED_BYTES)
        if self.shared_bytes is not None:
            names["SHARED_BYTES"] = self.shared_bytes(point, {**env, **shape})
        for expr in self.launch_restrictions:
            if not eval(expr, {"__builtins__": {}}, names):  # noqa: S307
                return expr
        return None

    def points(self, env: Mapping[str, Any],
               shape: Mapping[str, Any] | None = None) -> list[Point]:
        """Every valid point of the space, in a fixed order."""
        keys = list(self.params)
        out = []
        for values in itertools.product(*(self.params[k] for k in keys)):
            point = dict(zip(keys, values))
            if self.violated(point, env, shape) is None:
                out.append(point)
        return out

    def nearest(self, point: Mapping[str, Any], env: Mapping[str, Any],
                shape: Mapping[str, Any] | None = None) -> Point:
        """``point`` if it is valid here, else the valid point sharing most knob values with it
        (a default written for HIDDEN_DIM % 4 == 0 must still serve HIDDEN_DIM = 30); ``point``
        itself when no point is valid."""
        if self.violated(point, env, shape) is None:
            return dict(point)
        valid = self.points(env, shape)
        if not valid:
            return dict(point)
        return max(valid, key=lambda p: sum(p[k] == point[k] for k in p))

    def complete(self, partial: Mapping[str, Any] | None) -> Point:
        """``partial`` filled in from the default; unknown knobs and values are errors."""
        partial = dict(partial or {})
        for key, value in partial.items():
            if key not in self.params:
                raise ValueError(f"{self.kernel}: unknown launch parameter {key!r}; "
                                 f"expected one of {sorted(self.params)}")
            if value not in self.params[key]:
                raise ValueError(f"{self.kernel}: launch parameter {key}={value!r} is not one of "
                                 f"{list(self.params[key])}")
        return {**self.default, **partial}


def residual_pairs_space(kernel: str) -> KernelSpace:
    """The space of a kernel laid out as ``residual_pairs`` (heads_common.cuh): BLOCK threads, one
    warp per (b, h) pair of ROWS batch rows, VEC floats per load; VEC divides the row and a
    lane holds at most 32 floats of it."""
    return KernelSpace(
        kernel=kernel,
        params={"BLOCK": (32, 64, 128, 256, 512), "ROWS": (1, 2, 4, 8, 16), "VEC": (1, 2, 4)},
        default={"BLOCK": 128, "ROWS": 4, "VEC": 4},
        restrictions=("HIDDEN_DIM % VEC == 0",
                      "(HIDDEN_DIM + 32 * VEC - 1) // (32 * VEC) * VEC <= 32"),
    )
