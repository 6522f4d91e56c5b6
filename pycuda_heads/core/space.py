"""Launch-parameter search spaces: the knobs of one kernel, their values and restrictions.

Restrictions are plain Python expressions (Kernel Tuner style) evaluated over the knobs, the
template constants (N_HORIZONS, HIDDEN_DIM, N_ATOMS) and, for launch restrictions, the problem
shape (B, K), the device limit MAX_SHARED_BYTES and the derived SHARED_BYTES of the point.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from types import CodeType
from typing import Any, Callable, Iterator, Mapping

Point = dict[str, Any]

# Largest opt-in dynamic shared memory per block on sm_90 (227 KiB).
SM90_MAX_SHARED_BYTES = 227 * 1024


@lru_cache(maxsize=None)
def _code(expr: str) -> CodeType:
    return compile(expr, f"<restriction {expr}>", "eval")


def _holds(expr: str, names: Mapping[str, Any]) -> bool:
    return bool(eval(_code(expr), {"__builtins__": {}}, names))  # noqa: S307 - our own expressions


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
    # valid points (knob values in params order) per template: the walk of a large space takes
    # about a second, and nearest/complete/the tuner ask for the same template again and again
    _valid: dict[tuple, tuple[tuple, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        family, sep, role = self.kernel.partition(".")
        if not sep or not family or not role or "." in role:
            raise ValueError(f"kernel id {self.kernel!r} must be '<family>.<role>'")
        unknown = set(self.default) ^ set(self.params)
        if unknown:
            raise ValueError(f"{self.kernel}: default and params disagree on {sorted(unknown)}")

    @property
    def family(self) -> str:
        return self.kernel.partition(".")[0]

    @property
    def role(self) -> str:
        """The op's name for this kernel: its ``launch=`` key and entry ``<family>_<role>``."""
        return self.kernel.partition(".")[2]

    def violated(self, point: Mapping[str, Any], env: Mapping[str, Any],
                 shape: Mapping[str, Any] | None = None) -> str | None:
        """The first restriction ``point`` breaks (as written), or None when it is valid.

        ``env`` holds the template constants; with ``shape`` the launch restrictions apply too.
        """
        names = {**env, **point}
        for expr in self.restrictions:
            if not _holds(expr, names):
                return expr
        return None if shape is None else self._launch_violated(point, env, shape)

    def _launch_violated(self, point: Mapping[str, Any], env: Mapping[str, Any],
                         shape: Mapping[str, Any]) -> str | None:
        """The first launch restriction ``point`` breaks at ``shape``, or None."""
        names = {**env, **point, **shape}
        names.setdefault("MAX_SHARED_BYTES", SM90_MAX_SHARED_BYTES)
        if self.shared_bytes is not None:
            names["SHARED_BYTES"] = self.shared_bytes(point, {**env, **shape})
        for expr in self.launch_restrictions:
            if not _holds(expr, names):
                return expr
        return None

    def points(self, env: Mapping[str, Any],
               shape: Mapping[str, Any] | None = None) -> list[Point]:
        """Every valid point of the space, in a fixed order (knobs in ``params`` order, values
        in theirs)."""
        keys = list(self.params)
        out = [dict(zip(keys, row)) for row in self._rows(env)]
        if shape is None:
            return out
        return [p for p in out if self._launch_violated(p, env, shape) is None]

    def _rows(self, env: Mapping[str, Any]) -> tuple[tuple, ...]:
        """The valid points' knob values, walked once per template. A restriction is checked
        as soon as the knobs it names are bound, so a large space with few valid points is
        walked, not enumerated."""
        memo = tuple(sorted(env.items()))
        if memo in self._valid:
            return self._valid[memo]
        keys = list(self.params)
        due: list[list[str]] = [[] for _ in keys]
        for expr in self.restrictions:
            named = [keys.index(n) for n in _code(expr).co_names if n in self.params]
            due[max(named, default=0)].append(expr)
        out: list[tuple] = []

        def walk(depth: int, point: Point) -> None:
            if depth == len(keys):
                out.append(tuple(point.values()))
                return
            for value in self.params[keys[depth]]:
                point[keys[depth]] = value
                names = {**env, **point}
                if all(_holds(expr, names) for expr in due[depth]):
                    walk(depth + 1, point)
            del point[keys[depth]]

        walk(0, {})
        self._valid[memo] = tuple(out)
        return self._valid[memo]

    def nearest(self, point: Mapping[str, Any], env: Mapping[str, Any],
                shape: Mapping[str, Any] | None = None,
                keep: Mapping[str, Any] | None = None) -> Point:
        """``point`` if it is valid here, else the valid point sharing most knob values with it
        and every value of ``keep`` (a default written for HIDDEN_DIM % 4 == 0 must still serve
        HIDDEN_DIM = 30); ``point`` itself when no point is valid."""
        if self.violated(point, env, shape) is None:
            return dict(point)
        keep = keep or {}
        return next((p for p in self._alike(env, point)
                     if all(p[k] == v for k, v in keep.items())
                     and (shape is None or self._launch_violated(p, env, shape) is None)),
                    dict(point))

    def complete(self, partial: Mapping[str, Any] | None,
                 env: Mapping[str, Any] | None = None) -> Point:
        """``partial`` filled in from the default; unknown knobs and values are errors. With
        the template constants ``env``, a default that breaks a restriction next to the given
        knobs (``{"LAYOUT": 0}`` beside another layout's default) gives way to the valid point
        that keeps every given knob and shares most values with the default."""
        partial = dict(partial or {})
        for key, value in partial.items():
            if key not in self.params:
                raise ValueError(f"{self.kernel}: unknown launch parameter {key!r}; "
                                 f"expected one of {sorted(self.params)}")
            if value not in self.params[key]:
                raise ValueError(f"{self.kernel}: launch parameter {key}={value!r} is not one of "
                                 f"{list(self.params[key])}")
        point = {**self.default, **partial}
        if env is None or self.violated(point, env) is None:
            return point
        return next((p for p in self._alike(env, self.default)
                     if all(p[k] == v for k, v in partial.items())), point)

    def _alike(self, env: Mapping[str, Any], to: Mapping[str, Any]) -> Iterator[Point]:
        """The valid points, those sharing most knob values with ``to`` first (ties in the
        points' order): callers take the first that also meets their own condition."""
        keys, want = list(self.params), tuple(to[k] for k in self.params)
        rows = self._rows(env)
        shared = [sum(a == b for a, b in zip(row, want)) for row in rows]
        for i in sorted(range(len(rows)), key=lambda i: (-shared[i], i)):
            yield dict(zip(keys, rows[i]))


def by_role(*spaces: KernelSpace) -> dict[str, KernelSpace]:
    """An op's ``SPACES``: each space under its role, so a kernel id is written once."""
    return {s.role: s for s in spaces}


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
