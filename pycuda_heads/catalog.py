"""Every kernel of the library, collected from the ``SPECS`` of each module in
``pycuda_heads/ops``; and the tables derived from them: the suite (tuner tasks), the validation
grid, the benchmark cases and their floor bytes. Nothing here is written per kernel."""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable, Iterator, Mapping

from . import ops
from .core.spec import Dims, KernelSpec
from .records import FWD_BWD, FWD_LOSS_BWD

# The model size every suite shape is measured at.
SUITE_TEMPLATE = {"N_HORIZONS": 5, "HIDDEN_DIM": 128, "N_ATOMS": 21, "D_IN": 128, "FRD_HIDDEN": 128}


@dataclass(frozen=True)
class BenchCase:
    """One benchmarked pass of one op (a family) at one shape: the kernels it runs in order."""

    op: str
    pass_: str
    shape: Dims
    kernels: tuple[KernelSpec, ...]
    #: template constants that differ from the suite template (a wide model size)
    over: Dims = field(default_factory=dict)
    #: the same work unfused, where ``kernels`` start with a fused one (``KernelSpec.fuses``)
    separate: tuple[KernelSpec, ...] = ()

    @property
    def template(self) -> dict[str, int]:
        return {**SUITE_TEMPLATE, **self.over}

    @property
    def label_dims(self) -> dict[str, int]:
        """What names the case in results: its shape, preceded by any template override."""
        return {**self.over, **self.shape}

    def floor_bytes(self) -> int:
        """fwd+bwd is the sum of its passes: the rest of the network runs between them, so the
        backward reads its inputs again."""
        return sum(k.floor_bytes(k.template(self.template), self.shape) for k in self.kernels)

    def flops(self) -> int:
        """Floating-point operations of the kernels' declared matrix products."""
        return sum(k.flops(k.template(self.template), self.shape) for k in self.kernels)


class Catalog:
    """An ordered set of kernel specs, by id."""

    def __init__(self, specs: Iterable[KernelSpec]):
        self.specs: dict[str, KernelSpec] = {}
        for spec in specs:
            if spec.id in self.specs:
                raise ValueError(f"kernel {spec.id!r} is declared twice")
            self.specs[spec.id] = spec

    def __getitem__(self, kernel: str) -> KernelSpec:
        try:
            return self.specs[kernel]
        except KeyError:
            raise KeyError(f"unknown kernel {kernel!r}; expected one of {sorted(self.specs)}") \
                from None

    def __iter__(self) -> Iterator[KernelSpec]:
        return iter(self.specs.values())

    def __contains__(self, kernel: object) -> bool:
        return kernel in self.specs

    def with_specs(self, *extra: KernelSpec) -> "Catalog":
        return Catalog([*self, *extra])

    def families(self) -> dict[str, tuple[KernelSpec, ...]]:
        out: dict[str, list[KernelSpec]] = {}
        for spec in self:
            out.setdefault(spec.family, []).append(spec)
        return {f: tuple(v) for f, v in out.items()}

    def tasks(self) -> list[tuple[KernelSpec, dict[str, int], dict[str, int]]]:
        """(kernel, template, shape) of every suite point: what a sweep tunes."""
        return [(s, t, shape) for s in self for t, shape in s.suite_points(SUITE_TEMPLATE)]

    def grid(self, kernel: str) -> list[tuple[dict[str, int], dict[str, int]]]:
        """(template, shape) pairs a default variant is validated on: the odd-shape grid, then
        the suite."""
        s = self[kernel]
        odd = [(s.template({**SUITE_TEMPLATE, **over}), dict(shape)) for over, shape in s.grid]
        return odd + s.suite_points(SUITE_TEMPLATE)

    def bench_cases(self) -> list[BenchCase]:
        """Per family and suite shape: each kernel's pass, then fwd+bwd where the family has a
        forward and a backward (every other kernel that no kernel of the family fuses, in
        declaration order, but a fused forward such as ``forward_loss``, a pass of its own),
        and fwd+loss+bwd where a forward fuses other kernels: it and the backward, beside the
        same work unfused (``BenchCase.separate``: ``unfused``)."""
        out = []
        for family, specs in self.families().items():
            entries = list(dict.fromkeys(tuple(sorted(s.items())) for k in specs for s in k.suite))
            roles = {k.role: k for k in specs}
            fused = {f for k in specs for f in k.fuses}
            for items in entries:
                over = {k: v for k, v in items if k in SUITE_TEMPLATE}
                shape = {k: v for k, v in items if k not in SUITE_TEMPLATE}
                for k in specs:
                    out.append(BenchCase(family, k.pass_name, shape, (k,), over))
                if "forward" in roles and len(specs) > 1:
                    backward = tuple(k for k in specs
                                     if not k.role.startswith("forward") and k.id not in fused)
                    out.append(BenchCase(family, FWD_BWD, shape, (roles["forward"], *backward),
                                         over))
                    out += [BenchCase(family, FWD_LOSS_BWD, shape, (k, *backward), over,
                                      self.unfused(k, *backward))
                            for k in specs if k.role.startswith("forward") and k.fuses]
        return out

    def unfused(self, *specs: KernelSpec) -> tuple[KernelSpec, ...]:
        """The kernels that do ``specs``' work one at a time: each fused kernel replaced by the
        kernels it fuses, in turn."""
        return tuple(u for k in specs
                     for u in (self.unfused(*(self[f] for f in k.fuses)) if k.fuses else (k,)))

    def family_inputs(self, family: str, template: Mapping[str, int], shape: Dims,
                      seed: int = 0) -> dict[str, Any]:
        """Every tensor the family's kernels read, and the kernels they fuse (one draw per name,
        shared by its kernels)."""
        specs = self.families()[family]
        out: dict[str, Any] = {}
        for spec in (*specs, *(self[f] for k in specs for f in k.fuses)):
            out.update(spec.make_inputs(spec.template(template), shape, seed))
        return out


@lru_cache(maxsize=None)
def catalog() -> Catalog:
    """The library's kernels: ``SPECS`` of every module in ``pycuda_heads.ops``."""
    specs: list[KernelSpec] = []
    for info in sorted(pkgutil.iter_modules(ops.__path__), key=lambda m: m.name):
        specs.extend(getattr(importlib.import_module(f"{ops.__name__}.{info.name}"), "SPECS", ()))
    return Catalog(specs)
