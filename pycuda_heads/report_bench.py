"""Benchmark rows turned into cases (op x shape x pass, one row per provider), the derived
ratios, and the team's targets (issue 6) with whether each is met and by how much."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from .bench import BOTH, OPS, shape_label

PROVIDERS = ("tuned", "default", "torch_eager", "torch_compile")
LABELS = {"tuned": "tuned", "default": "default", "torch_eager": "torch eager",
          "torch_compile": "torch.compile", "floor": "floor"}
PASS_ORDER = ("forward", "backward", BOTH)

# The team's goal, measured on the H200 (issue 6).
FLOOR_GOAL = 0.75     # largest shapes, fwd+bwd: fraction of the copy-bandwidth floor
COMPILE_GOAL = 5.0    # largest shapes, fwd+bwd: speed-up over torch.compile
EMPTY_GOAL = 2.0      # smallest shapes: GPU time over one empty kernel launch


def shape_text(shape: Any) -> str:
    """A shape as the CSV spells it ('B=4096,K=256'), from a dict or a string."""
    return shape_label(shape) if isinstance(shape, dict) else str(shape or "")


def shape_size(shape: str) -> int:
    """'B=4096,K=256' -> 4096*256: orders the shapes of an op."""
    sizes = []
    for part in shape.split(","):
        try:
            sizes.append(int(part.split("=", 1)[1]))
        except (IndexError, ValueError):
            return 0
    return math.prod(sizes)


@dataclass
class Case:
    op: str
    shape: str
    pass_: str
    rows: dict[str, dict[str, Any]]

    def time(self, provider: str) -> float | None:
        row = self.rows.get(provider)
        return row.get("median_us") if row and not row.get("error") else None

    def error(self, provider: str) -> str | None:
        row = self.rows.get(provider)
        return (row.get("error") or None) if row else None

    def call_us(self, provider: str) -> float | None:
        row = self.rows.get(provider)
        return row.get("python_call_us") if row and not row.get("error") else None

    def over_tuned(self, provider: str) -> float | None:
        """``provider``'s time over the tuned time: the tuned kernels' speed-up over it."""
        t, other = self.time("tuned"), self.time(provider)
        return other / t if t and other else None

    @property
    def floor_fraction(self) -> float | None:
        return self.over_tuned("floor")


def op_order(op: str) -> tuple[int, str]:
    return (OPS.index(op) if op in OPS else len(OPS), op)


def pass_order(pass_: str) -> tuple[int, str]:
    return (PASS_ORDER.index(pass_) if pass_ in PASS_ORDER else len(PASS_ORDER), pass_)


def cases(rows: Iterable[dict[str, Any]]) -> list[Case]:
    grouped: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for row in rows:
        if row.get("op") == "empty_kernel":
            continue
        key = (row.get("op", ""), row.get("shape", ""), row.get("pass", ""))
        grouped.setdefault(key, {})[row.get("provider", "")] = row
    out = [Case(op, shape, pass_, r) for (op, shape, pass_), r in grouped.items()]
    out.sort(key=lambda c: (op_order(c.op), shape_size(c.shape), c.shape, pass_order(c.pass_)))
    return out


def empty_kernel_us(rows: Iterable[dict[str, Any]]) -> float | None:
    for row in rows:
        if row.get("provider") == "empty_kernel" and not row.get("error"):
            return row.get("median_us")
    return None


def ops(all_cases: Sequence[Case]) -> list[str]:
    return sorted({c.op for c in all_cases}, key=op_order)


def extreme_cases(all_cases: Sequence[Case], op: str, largest: bool) -> list[Case]:
    """The cases of ``op`` at its largest (or smallest) measured shape."""
    mine = [c for c in all_cases if c.op == op]
    if not mine:
        return []
    pick = (max if largest else min)(shape_size(c.shape) for c in mine)
    return [c for c in mine if shape_size(c.shape) == pick]


@dataclass
class Target:
    goal: str      # which of the three goals
    case: Case
    value: float | None
    met: bool | None  # None: not measured
    detail: str


def _floor_target(case: Case) -> Target:
    f, t, floor = case.floor_fraction, case.time("tuned"), case.time("floor")
    if f is None or t is None or floor is None:
        return Target("floor", case, None, None, _why_unmeasured(case, ("tuned", "floor")))
    if f >= FLOOR_GOAL:
        return Target("floor", case, f, True, f"reaches {f:.0%} of the floor")
    return Target("floor", case, f, False,
                  f"reaches {f:.0%} of the floor, {100 * (FLOOR_GOAL - f):.0f} points short: "
                  f"needs {FLOOR_GOAL / f:.2f}x faster (<= {floor / FLOOR_GOAL:.1f} us)")


def _compile_target(case: Case) -> Target:
    x, compiled = case.over_tuned("torch_compile"), case.time("torch_compile")
    if x is None or compiled is None:
        return Target("compile", case, None, None,
                      _why_unmeasured(case, ("tuned", "torch_compile")))
    if x >= COMPILE_GOAL:
        return Target("compile", case, x, True, f"{x:.2f}x faster than torch.compile")
    return Target("compile", case, x, False,
                  f"{x:.2f}x faster than torch.compile: needs {COMPILE_GOAL / x:.2f}x more "
                  f"(<= {compiled / COMPILE_GOAL:.1f} us)")


def _empty_target(case: Case, empty_us: float | None) -> Target:
    t = case.time("tuned")
    if t is None or not empty_us:
        why = "no empty-kernel measurement" if not empty_us else _why_unmeasured(case, ("tuned",))
        return Target("empty", case, None, None, why)
    r = t / empty_us
    if r <= EMPTY_GOAL:
        return Target("empty", case, r, True, f"{r:.2f}x an empty launch")
    return Target("empty", case, r, False,
                  f"{r:.2f}x an empty launch: {r / EMPTY_GOAL:.2f}x too slow "
                  f"(needs <= {EMPTY_GOAL * empty_us:.1f} us)")


def _why_unmeasured(case: Case, providers: Sequence[str]) -> str:
    reasons = []
    for p in providers:
        if case.time(p) is None:
            err = case.error(p)
            reasons.append(f"{LABELS[p]} {'failed: ' + err if err else 'not measured'}")
    return "; ".join(reasons) or "not measured"


def targets(all_cases: Sequence[Case], empty_us: float | None) -> list[Target]:
    """Every target of every op: the two largest-shape goals on fwd+bwd, then the small-shape
    goal on every pass of the smallest shape."""
    out: list[Target] = []
    for op in ops(all_cases):
        for case in extreme_cases(all_cases, op, largest=True):
            if case.pass_ == BOTH:
                out += [_floor_target(case), _compile_target(case)]
    for op in ops(all_cases):
        out += [_empty_target(c, empty_us) for c in extreme_cases(all_cases, op, largest=False)]
    return out
