"""Multi-tensor Adam (cu/multiadam.cu): one launch updates every parameter of a list, through a
device table of (addresses, length, first block) that the grid's blocks walk. The element
update is per-array Adam's (``Adam.step``), so the results are bitwise the same.

A training step captured as a CUDA graph keeps its step counter on the device: an
``AdamSchedule`` (t and lr) that ``step_scheduled``'s one launch advances and reads, so a replay
needs no argument from the host."""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .. import reference as ref
from ..core.arrays import as_device, empty, empty_parts
from ..core.device import cuda
from ..core.op import Op
from ..core.space import KernelSpace, by_role
from ..core.spec import KernelSpec, Tensor, normal, positive_small

SPACE = KernelSpace(
    kernel="multiadam.step",
    params={"BLOCK": (64, 128, 256, 512, 1024), "ITEMS": (1, 2, 4, 8)},
    default={"BLOCK": 256, "ITEMS": 1},
)

#: addresses of param, grad, m, v, param_out, m_out, v_out; length; first block (cu/multiadam.cu)
TABLE_COLS = 9
_NULL = np.intp(0)


class AdamSchedule:
    """Adam's step counter and learning rate on the device: ``counters`` (int32, one per block
    of the update launch, each advanced by its own block: all hold the last step taken) and
    ``lr`` (float32 [1]). It serves one list of tensors (one launch's blocks)."""

    def __init__(self, lr: float) -> None:
        self.counters, self.lr = empty((1,), np.int32), empty((1,))
        self.reset(lr)

    def reset(self, lr: float, t: int = 0) -> None:
        """Start again after step ``t`` with learning rate ``lr`` (a synchronous copy)."""
        self.counters.set(np.full(self.counters.size, t, np.int32))
        self.set_lr(lr)

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next steps (a synchronous copy: not while a capture runs)."""
        cuda().memcpy_htod(self.lr.gpudata, np.array([lr], np.float32))

    def counters_for(self, blocks: int) -> Any:
        """The counters of a launch of ``blocks`` blocks, made (at the last step taken, a
        synchronous copy: before any capture) when there are fewer."""
        if blocks > self.counters.size:
            self.counters = as_device(np.full(blocks, self.t, np.int32), "counters", ("N",), {},
                                      np.int32)
        return self.counters

    @property
    def t(self) -> int:
        """The last step taken (reads the device: synchronises)."""
        return int(self.counters.get()[0])


def _pointers(name: str, arrays: Sequence[Any], shapes: Sequence[tuple] | None) -> list[Any]:
    """Each of ``arrays`` as a float32 C-contiguous device array (of ``shapes[i]`` when given);
    errors name the list and the index."""
    if not isinstance(arrays, (list, tuple)):
        raise TypeError(f"{name}: expected a list of device arrays, got {type(arrays).__name__}")
    out = []
    for i, x in enumerate(arrays):
        if not (hasattr(x, "gpudata") or hasattr(x, "__cuda_array_interface__")):
            raise TypeError(f"{name}[{i}]: expected a device array (GPUArray or CUDA array), "
                            f"got {type(x).__name__}; the update is in place")
        shape = np.shape(x) if shapes is None else shapes[i]
        axes = tuple(f"N{j}" for j in range(len(shape)))
        out.append(as_device(x, f"{name}[{i}]", axes, dict(zip(axes, shape))))
    return out


class MultiAdam(Op):
    """adam.step_all(params, grads, ms, vs, t): step ``t`` (from 1) of Adam over every tensor
    of the lists, in place, with one launch."""

    FAMILY = "multiadam"
    SPACES = by_role(SPACE)
    PDL = True
    #: device tables kept per list of addresses before the cache starts afresh
    TABLES = 64

    def __init__(self, lr: float = ref.ADAM_LR, beta1: float = ref.ADAM_BETA1,
                 beta2: float = ref.ADAM_BETA2, eps: float = ref.ADAM_EPS,
                 launch: Mapping[str, Mapping[str, Any]] | None = None):
        super().__init__({}, launch)
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self._tables: dict[tuple, tuple[Any, int]] = {}

    def step_all(self, params: Sequence[Any], grads: Sequence[Any], ms: Sequence[Any],
                 vs: Sequence[Any], t: int, *, stream: Any = None) -> None:
        """Update every ``params[i]``, ``ms[i]``, ``vs[i]`` in place from ``grads[i]`` (float32
        device arrays, each quadruple of one shape). Checked before anything is launched."""
        self._check_t(t)
        p = _pointers("params", params, None)
        shapes = [x.shape for x in p]
        lists = [p]
        for name, arrays in (("grads", grads), ("ms", ms), ("vs", vs)):
            if not isinstance(arrays, (list, tuple)) or len(arrays) != len(p):
                raise ValueError(f"{name}: expected a list of {len(p)} device arrays (one per "
                                 f"param), got {arrays!r:.80}")
            lists.append(_pointers(name, arrays, shapes))
        self._launch(_rows(*lists), t, None, stream)

    def step_scheduled(self, params: Sequence[Any], grads: Sequence[Any], ms: Sequence[Any],
                       vs: Sequence[Any], schedule: AdamSchedule, *, stream: Any = None) -> None:
        """``step_all`` at the step after ``schedule``'s, which its one launch advances on the
        device (each block its own counter): arguments that never change, what a CUDA graph
        replays. The arrays are the caller's own GPUArrays, already checked (a training
        step's)."""
        self._launch(_rows(params, grads, ms, vs), 1, schedule, stream)

    def step_split(self, param: Any, grad: Any, m: Any, v: Any, t: int, *,
                   stream: Any = None) -> tuple[Any, Any, Any]:
        """``Adam.step`` out of place over flat arrays cut into pieces of uneven lengths
        (``pieces``), one table row each: what validation checks the table walk with."""
        self._check_t(t)
        dims: dict[str, int] = {}
        arrays = [as_device(x, name, ("N",), dims)
                  for name, x in (("param", param), ("grad", grad), ("m", m), ("v", v))]
        n = dims["N"]
        out = empty_parts((n,), (n,), (n,), align=4)
        rows = tuple((*(int(a.gpudata) + 4 * at for a in (*arrays, *out)), length)
                     for at, length in pieces(n))
        self._launch(rows, t, None, stream)
        return tuple(out)

    def _check_t(self, t: int) -> None:
        if not isinstance(t, (int, np.integer)) or isinstance(t, bool) or t < 1:
            raise ValueError(f"t: expected the step number, an int >= 1, got {t!r}")

    def _plan(self) -> Any:
        return self.plan("step", {}, lambda p: ((1, 1, 1), (p["BLOCK"], 1, 1), 0))

    def _table(self, rows: tuple[tuple[int, ...], ...], per_block: int) -> tuple[Any, int]:
        """(device table, blocks) of ``rows`` (7 addresses and a length each), made once per
        list of rows: its copy to the device is synchronous, so a graph capture must find the
        table made by an earlier call with the same arrays."""
        key = (per_block, rows)
        hit = self._tables.get(key)
        if hit is None:
            table, first = [], 0
            for row in rows:
                table.append([*row, first])
                first += -(-row[7] // per_block)
            if len(self._tables) >= self.TABLES:
                self._tables.clear()
            hit = self._tables[key] = (as_device(np.array(table, np.int64), "table",
                                                 ("N", "C"), {}, np.int64), first)
        return hit

    def _launch(self, rows: tuple[tuple[int, ...], ...], t: int,
                schedule: AdamSchedule | None, stream: Any) -> None:
        if not rows:
            return
        plan = self._plan()
        table, blocks = self._table(rows, plan.params["BLOCK"] * plan.params["ITEMS"])
        b1, b2, t = self.beta1, self.beta2, int(t)
        # Python floats: packed as float32, as per-array Adam packs them (beta*_64 as double)
        plan.kernel((blocks, 1, 1), plan.block, table=table.gpudata, n_tensors=len(rows),
                    counters=_NULL if schedule is None else schedule.counters_for(blocks).gpudata,
                    lr_dev=_NULL if schedule is None else schedule.lr.gpudata,
                    lr=self.lr, beta1=b1, beta2=b2, one_minus_beta1=1 - b1,
                    one_minus_beta2=1 - b2, eps=self.eps, bc1=1 - b1 ** t, bc2=1 - b2 ** t,
                    beta1_64=float(b1), beta2_64=float(b2), stream=stream)


def _rows(params: Sequence[Any], grads: Sequence[Any], ms: Sequence[Any],
          vs: Sequence[Any]) -> tuple[tuple[int, ...], ...]:
    """In-place table rows: param, grad, m, v, then param, m, v again as the outputs."""
    return tuple((*(int(x.gpudata) for x in (p, g, m, v, p, m, v)), int(p.size))
                 for p, g, m, v in zip(params, grads, ms, vs))


def pieces(n: int) -> list[tuple[int, int]]:
    """(offset, length) of the uneven pieces ``step_split`` cuts ``n`` elements into: lengths
    1, 2, 3, 5, 8, ... then the rest, so pieces end inside blocks and span several."""
    out, at, a, b = [], 0, 1, 2
    while at < n:
        length = min(a, n - at)
        out.append((at, length))
        at, a, b = at + length, b, a + b
    return out


def torch_step(torch: Any, param: Any, grad: Any, m: Any, v: Any, t: int) -> tuple[Any, ...]:
    """The same update in torch ops (torch.optim.Adam's single-tensor formula)."""
    b1, b2 = ref.ADAM_BETA1, ref.ADAM_BETA2
    m, v = torch.lerp(m, grad, 1 - b1), v * b2 + (1 - b2) * grad.square()
    denom = (v / (1 - b2 ** t)).sqrt() + ref.ADAM_EPS
    return param - ref.ADAM_LR / (1 - b1 ** t) * m / denom, m, v


def host_bias_correction(beta: float, t: int) -> np.float32:
    """``multiadam_step``'s device bias correction 1 - beta^t: the same products by squaring,
    in the same order."""
    r = 1.0
    while t:
        if t & 1:
            r *= beta
        beta *= beta
        t >>= 1
    return np.float32(1.0 - r)


# Validation runs step _T, as per-array Adam's does.
_T = 3


def oracles(make_op: Callable[[Mapping[str, int]], Any], template: Mapping[str, int]) -> dict:
    """Eight tensors of the smoke model's sizes and five steps: ``step_all`` is bitwise per-array
    Adam's arithmetic (the float64 reference within 1e-6, and the scheduled steps on the device
    counter bitwise the host-numbered ones)."""
    import pycuda.gpuarray as gpuarray
    rng = np.random.default_rng(2034)
    sizes = (640, 640, 5, 5, 16384, 128, 13440, 105)
    p0 = [rng.standard_normal(n, dtype=np.float32) for n in sizes]
    grads = [[rng.standard_normal(n, dtype=np.float32) for n in sizes] for _ in range(5)]
    adam = make_op(template)
    runs = []
    for scheduled in (False, True):
        p, m, v = ([gpuarray.to_gpu(x if k == 0 else np.zeros_like(x)) for x in p0]
                   for k in range(3))
        schedule = AdamSchedule(adam.lr) if scheduled else None
        for t, g in enumerate(grads, 1):
            g_dev = [gpuarray.to_gpu(x) for x in g]
            if scheduled:
                adam.step_scheduled(p, g_dev, m, v, schedule)
            else:
                adam.step_all(p, g_dev, m, v, t)
        runs.append(np.concatenate([x.get() for x in p]))
    err = 0.0
    for i, x in enumerate(p0):
        want, m64, v64 = x.astype(np.float64), np.zeros(x.size), np.zeros(x.size)
        for t, g in enumerate(grads, 1):
            want, m64, v64 = ref.adam_step(want, g[i], m64, v64, t)
        got = runs[0][sum(sizes[:i]):sum(sizes[: i + 1])]
        err = max(err, float(np.abs(got - want).max() / np.abs(want).max()))
    return {"model_tensors": {"passed": err <= 1e-6 and runs[0].tobytes() == runs[1].tobytes(),
                              "max_rel_err": err}}


_READS, _WRITES = ("param", "grad", "m", "v"), ("param_out", "m_out", "v_out")
SPECS = (
    # v is a running mean of squares: positive
    KernelSpec(op=MultiAdam, method="step_split", space=SPACE, template_keys=(),
               tensors={n: Tensor(("N",), draw=positive_small if n == "v" else normal)
                        for n in (*_READS, *_WRITES)},
               reads=_READS, writes=_WRITES,
               reference=functools.partial(ref.adam_step, t=_T),
               peer=functools.partial(torch_step, t=_T), oracles=oracles,
               call_kwargs={"t": _T},
               # the smoke model's eight parameters (31347 floats), and a whole model's
               suite=({"N": 31347}, {"N": 1 << 20}),
               grid=(({}, {"N": 1}), ({}, {"N": 7}), ({}, {"N": 1000}), ({}, {"N": 100003}))),
)
