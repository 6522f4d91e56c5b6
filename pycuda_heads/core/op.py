"""Common machinery of the op objects: template constants, launch-parameter choice (user >
tuned table > default), compiled-kernel cache and the report of what was chosen."""
from __future__ import annotations

import hashlib
import logging
import sys
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, ClassVar, Mapping, NamedTuple

from . import device
from .compile import NVCC_OPTIONS, WGMMA_KNOB, Kernel, get_kernel, variant_arch
from .source import render
from .space import KernelSpace
from .tuned import lookup

log = logging.getLogger("pycuda_heads")


class Launch(NamedTuple):
    """One role's launch at one shape, as ``Op.plan`` caches it."""
    params: dict[str, Any]
    #: the kernel's launch as a bound method: a call naming every argument then binds them in
    #: place, where calling the kernel object would first build a dict of them (about 4,500
    #: machine instructions a launch under valgrind; probes/host_cost_instructions.py)
    kernel: Callable[..., None]
    grid: tuple
    block: tuple
    shared: int
    chosen: dict[str, Any]


class Op:
    """Base of every op. Subclasses set FAMILY (the .cu file ``<FAMILY>.cu``, whose entry
    ``<FAMILY>_<role>`` each role launches) and SPACES (role -> KernelSpace)."""

    FAMILY: ClassVar[str]
    SPACES: ClassVar[dict[str, KernelSpace]]
    #: folder of ``<FAMILY>.cu``; None for the package's own sources
    SOURCE_DIR: ClassVar[Path | None] = None
    #: every entry of ``<FAMILY>.cu`` starts by waiting for the stream's previous kernel
    #: (``griddepcontrol.wait``: ``pdl_enter()``, which also lets the next kernel launch early,
    #: or ``pdl_wait()``), so its launches may use programmatic dependent launch
    PDL: ClassVar[bool] = False
    #: set False on an instance to ignore the shipped tuned table (what the op does on a GPU
    #: with none: the bench's default column)
    use_table: bool = True

    @classmethod
    def constructor_kwargs(cls, template: Mapping[str, int]) -> dict[str, int]:
        """Constructor arguments from template constants (N_HORIZONS -> n_horizons)."""
        return {k.lower(): int(v) for k, v in template.items()}

    def __init__(self, template: Mapping[str, int],
                 launch: Mapping[str, Mapping[str, Any]] | None = None):
        for key, value in template.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{type(self).__name__}: {key.lower()} must be a positive int, "
                                 f"got {value!r}")
        self.template = dict(template)
        name = type(self).__name__
        if launch is not None and not isinstance(launch, Mapping):
            raise TypeError(f"{name}: launch= must map kernel roles to parameter dicts, e.g. "
                            f"{{{next(iter(self.SPACES))!r}: {{'BLOCK': 256}}}}, got "
                            f"{type(launch).__name__}")
        launch = dict(launch or {})
        for role, params in launch.items():
            if not isinstance(params, Mapping):
                raise TypeError(f"{name}: launch[{role!r}] must be a dict of launch "
                                f"parameters, got {params!r}")
        unknown = set(launch) - set(self.SPACES)
        if unknown:
            raise ValueError(f"{name}: launch= has unknown kernels {sorted(unknown)}; "
                             f"expected keys among {sorted(self.SPACES)}")
        self._given = {role: dict(p) for role, p in launch.items()}
        self._user = {role: self.SPACES[role].complete(p, self.template)
                      for role, p in launch.items()}
        for role, params in self._user.items():
            reason = self.SPACES[role].violated(params, self.template)
            if reason:
                raise ValueError(f"{name}: launch[{role!r}]={params} breaks "
                                 f"the restriction {reason!r}")
        device.cuda()
        self._slug = device.gpu_slug()
        self._max_shared = device.max_shared_bytes()
        self._resolved: dict[tuple, dict[str, Any]] = {}
        self._kernels: dict[tuple, Kernel] = {}
        self._plans: dict[tuple, Launch] = {}
        #: the input signatures ``Inputs.adapt`` has checked for this op, with their dims
        self._checked: dict[tuple, dict[str, int]] = {}
        #: role -> {"params": ..., "source": "user" | "tuned ..." | "default ..."} of the last call
        self.chosen: dict[str, dict[str, Any]] = {}

    def launch_params(self, role: str, shape: Mapping[str, int]) -> dict[str, Any]:
        """Launch parameters for ``role`` at ``shape``; raises ValueError when no valid choice
        can run this shape (for example K beyond the shared memory of the device). Resolved
        once per shape; a repeat call is a dictionary lookup."""
        key = (role, *shape.items())
        hit = self._resolved.get(key)
        if hit is None:
            hit = self._resolved[key] = self._resolve(role, shape)
        self.chosen[role] = hit
        return hit["params"]

    def plan(self, role: str, shape: Mapping[str, int],
             geometry: Callable[[Mapping[str, Any]], tuple[tuple, tuple, int]],
             defines: Mapping[str, int] | None = None) -> Launch:
        """Everything a launch of ``role`` at ``shape`` needs, worked out on the first call at
        that shape: parameters, prepared kernel, and ``geometry(params)`` = (grid, block,
        shared bytes). ``defines`` are constants the kernel is compiled with beside the
        parameters (a variant of the chosen launch, such as the pool's split-K one). A repeat
        call is one dictionary lookup."""
        key = (role, *shape.values()) if defines is None else (role, *shape.values(),
                                                                *defines.items())
        hit = self._plans.get(key)
        if hit is None:
            params = self.launch_params(role, shape)
            kernel = self.kernel(role, {**params, **(defines or {})})
            hit = self._plans[key] = Launch(params, kernel.__call__, *geometry(params),
                                            self.chosen[role])
        self.chosen[role] = hit.chosen
        return hit

    def _resolve(self, role: str, shape: Mapping[str, int]) -> dict[str, Any]:
        space = self.SPACES[role]
        if role in self._user:
            # knobs left out that cannot run this shape (shared memory) give way to the nearest
            # point that keeps every given one
            params = space.nearest(self._user[role], self.template,
                                   {**shape, "MAX_SHARED_BYTES": self._max_shared},
                                   keep=self._given[role])
            source = "user"
        else:
            if self.use_table:
                tuned, source = lookup(space.kernel, self.template, shape, self._slug,
                                       op_source_hash(type(self)))
                params = space.complete(tuned, self.template) if tuned else None
                if params is not None and self._violated(space, params, shape):
                    params, source = None, f"default (tuned entry cannot run {dict(shape)})"
            else:
                params, source = None, "default (tuned table not used)"
            if params is None:
                # a default written for D % 4 == 0 must still serve D = 30
                params = space.nearest(space.default, self.template,
                                       {**shape, "MAX_SHARED_BYTES": self._max_shared})
        reason = self._violated(space, params, shape)
        if reason:
            need = space.shared_bytes(params, {**self.template, **shape}) if space.shared_bytes else 0
            raise ValueError(f"{type(self).__name__}.{role}: shape {dict(shape)} cannot run with "
                             f"{params} ({source}): restriction {reason!r} fails"
                             + (f" (needs {need} B shared memory, device allows "
                                f"{self._max_shared} B)" if "SHARED" in reason else ""))
        log.debug("%s.%s %s: %s", type(self).__name__, role, dict(shape), source)
        return {"params": params, "source": source}

    def _violated(self, space: KernelSpace, params: Mapping[str, Any],
                  shape: Mapping[str, int]) -> str | None:
        return space.violated(params, self.template,
                              {**shape, "MAX_SHARED_BYTES": self._max_shared})

    @classmethod
    def entries(cls, role: str, params: Mapping[str, Any]) -> tuple[str, ...]:
        """The ``extern "C"`` entries of the family's module that a call of ``role`` launches at
        ``params``, in order (a launch of another family's op, such as a reduce, not among
        them): what the static check and ``identity`` hold to be the variant's own code."""
        return (f"{cls.FAMILY}_{role}",)

    def kernel(self, role: str, params: Mapping[str, Any], entry: str | None = None) -> Kernel:
        """The kernel of ``role``'s last launch at ``params``, or of ``entry`` (one of
        ``entries``)."""
        entry = entry or self.entries(role, params)[-1]
        key = (entry, *params.items())
        k = self._kernels.get(key)
        if k is None:
            # a variant built for sm_90a is refused in words on another GPU, not by the driver
            if variant_arch(params) and (cc := device.compute_capability()) != (9, 0):
                raise ValueError(f"{type(self).__name__}: {entry} is built with "
                                 f"{WGMMA_KNOB}={params[WGMMA_KNOB]}, "
                                 f"which needs an sm_90 GPU (Hopper); this one is "
                                 f"sm_{''.join(map(str, cc))}")
            k = self._kernels[key] = get_kernel(self.FAMILY, entry,
                                                {**self.template, **params}, self.SOURCE_DIR,
                                                self.PDL)
        return k


class HorizonOp(Op):
    """An op over N_HORIZONS horizons of HIDDEN_DIM features; its arrays' H and D axes are
    bound by those constants."""

    def __init__(self, n_horizons: int, hidden_dim: int,
                 launch: Mapping[str, Mapping[str, Any]] | None = None):
        super().__init__({"N_HORIZONS": n_horizons, "HIDDEN_DIM": hidden_dim}, launch)
        self.n_horizons, self.hidden_dim = n_horizons, hidden_dim
        #: the axes the template binds, as ``Inputs.adapt`` takes them
        self.bound = {"H": n_horizons, "D": hidden_dim}


def _modules_used(module: ModuleType) -> list[ModuleType]:
    """``module`` and every module of its package it takes a name from, transitively: the op
    module and the ops it calls (the reduce of a backward pass)."""
    package = module.__name__.rpartition(".")[0]
    seen, todo = {module.__name__: module}, [module]
    while todo:
        for value in vars(todo.pop()).values():
            name = getattr(value, "__module__", None)
            if package and isinstance(name, str) and name.rpartition(".")[0] == package \
                    and name not in seen and name in sys.modules:
                seen[name] = sys.modules[name]
                todo.append(sys.modules[name])
    return [seen[name] for name in sorted(seen)]


@lru_cache(maxsize=None)
def op_source_hash(op: type) -> str:
    """Identity of everything that decides how ``op`` runs: its module (the host launch code:
    grids, shared-memory sizes), the ``.cu`` file of every op family that module and the ops it
    calls define (shared header inlined) and the compiler options. A tuned entry holds it and
    applies only while it is unchanged."""
    h = hashlib.sha256("\0".join(NVCC_OPTIONS).encode())
    for module in _modules_used(sys.modules[op.__module__]):
        h.update(module.__name__.encode() + b"\0")
        if getattr(module, "__file__", None):
            h.update(Path(module.__file__).read_bytes() + b"\0")
        families = {(v.FAMILY, v.SOURCE_DIR) for v in vars(module).values()
                    if isinstance(v, type) and issubclass(v, Op) and v.__module__ ==
                    module.__name__ and hasattr(v, "FAMILY")}
        for family, folder in sorted(families, key=lambda f: f[0]):
            h.update(render(family, {}, folder).encode() + b"\0")
    return h.hexdigest()[:16]
