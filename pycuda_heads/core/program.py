"""Launch programs: the kernel launches of one op call at one signature, worked out once and
made again with other pointers.

``record`` runs an op method dry (its launches recorded, not made) over stand-in addresses:
the inputs at fake addresses, every buffer the op allocates from a tracing memory source. Each
pointer argument of each launch is then an input, an output or scratch at an offset, and every
other argument a constant of the signature. ``Program.run`` makes the same launches on a raw
stream handle with the caller's memory (another framework's tensors: no array object per
argument, no allocation of its own, nothing that synchronises, so a graph capture can hold it).

What the op decides on the host (grid, launch parameters, scratch sizes, alignment checks)
depends only on what the signature holds: shapes, which optional inputs are given, each input's
address modulo 256, and the op's own configuration. Scalars the caller varies per call (Adam's
step) are not part of it: such a call records a program for each call.
"""
from __future__ import annotations

import bisect
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from .arrays import wrap
from .compile import DriverKernel, on_any_stream
from .device import bind_primary_context, thread_context
from .runtime import scoped

# Stand-in addresses: far above any real device address, one 2^40-byte span each.
_SPAN = 1 << 40
_INPUTS, _ALLOCATIONS = 1 << 56, 1 << 57
#: where each pointer argument comes from
INPUT, OUTPUT, SCRATCH = 0, 1, 2
#: scratch regions start at multiples of this (no buffer an op allocates asks for more)
ALIGN = 256


class ArraySpec(NamedTuple):
    """An input as the op sees it while recording: shape, dtype, address modulo ``ALIGN``."""
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int = 0


class _Tracer:
    """A memory source handing out stand-in addresses and remembering each allocation."""

    def __init__(self) -> None:
        self.allocations: list[tuple[int, int]] = []

    def allocate(self, nbytes: int) -> tuple[int, None]:
        base = _ALLOCATIONS + len(self.allocations) * _SPAN
        self.allocations.append((base, nbytes))
        return base, None


class _Launch(NamedTuple):
    kernel: DriverKernel
    grid: tuple
    block: tuple
    shared: int
    values: list
    #: (argument position, INPUT/OUTPUT/SCRATCH, index, byte offset) of each pointer argument
    pointers: tuple[tuple[int, int, int, int], ...]


class Program:
    """The launches of one recorded call; ``outputs`` are the (shape, dtype) of the buffers
    the caller allocates for them, each its own (no output aliases another), and
    ``scratch_bytes`` the size of the one scratch buffer they also need (0: none)."""

    def __init__(self, launches: list[_Launch], outputs: list[tuple[tuple[int, ...], np.dtype]],
                 scratch_bytes: int) -> None:
        self.launches = launches
        self.outputs = outputs
        self.scratch_bytes = scratch_bytes

    def run(self, inputs: Sequence[int], outputs: Sequence[int], scratch: int,
            stream: int) -> None:
        """Make the launches on the stream handle ``stream``, with the device addresses of the
        inputs (in the recorded order; 0 for an absent optional one), of the outputs and of
        the scratch buffer. Any thread may run it."""
        bind_primary_context()
        bases = (inputs, outputs, (scratch,))
        for launch in self.launches:
            values = launch.values.copy()
            for at, kind, index, offset in launch.pointers:
                values[at] = bases[kind][index] + offset
            launch.kernel.launch_values(launch.grid, launch.block, values, launch.shared, stream)

    def describe(self, device: int) -> tuple:
        """The program as plain data for a launcher outside Python: (launches, output shapes,
        scratch bytes, device), each launch (function handle, grid, block, shared bytes, pdl,
        argument slots with pointers zero, (slot, INPUT/OUTPUT/SCRATCH, index, offset) of each
        pointer)."""
        launches = [(launch.kernel.handle, _three(launch.grid), _three(launch.block), launch.shared,
                     launch.kernel.pdl, launch.kernel.slots(launch.values), list(launch.pointers))
                    for launch in self.launches]
        return launches, [list(shape) for shape, _ in self.outputs], self.scratch_bytes, device


def record(call: Callable[[list[Any]], Any], inputs: Sequence[ArraySpec | None],
           outputs: Callable[[Any], Sequence[Any]]) -> Program:
    """The program of ``call(arrays)``, an op method's call over device arrays standing for
    ``inputs`` (None stays None). ``outputs(result)`` picks what the caller gets back from what
    the call returned: arrays, or tuples of arrays laid back to back (one buffer holding them,
    as a row of gradients the kernels write as one)."""
    arrays = [None if spec is None else
              wrap(spec.shape, spec.dtype, _INPUTS + i * _SPAN + spec.offset)
              for i, spec in enumerate(inputs)]
    tracer = _Tracer()
    # loading a kernel for raw launches needs the context current in this thread (torch's
    # autograd threads start with none)
    with thread_context():
        with scoped(recording=[], dry=True, source=tracer, poison=False) as now:
            result = call(arrays)
        return _program(now.recording, tracer.allocations, arrays,
                        [_span(picked) for picked in outputs(result)])


def _program(recorded: list[tuple], allocations: list[tuple[int, int]], arrays: list[Any],
             spans: list[tuple[int, int, tuple[int, ...]]]) -> Program:
    """The program of the launches ``recorded`` dry over ``arrays`` (the inputs) and
    ``allocations`` (base, bytes), handing back the output ``spans`` (start, bytes, shape)."""
    input_spans = [(int(a.gpudata), a.nbytes) for a in arrays if a is not None]

    # Cut each allocation at every pointer argument and output start that is not inside an
    # output: each piece is one buffer the op made (or a row of them, kept whole).
    cuts: dict[int, set[int]] = {base: {base} for base, _ in allocations}
    starts = [base for base, _ in allocations]
    for kernel, _, _, values, _, _ in recorded:
        for t, v in zip(kernel.types, values):
            if t == "P" and int(v) >= _ALLOCATIONS:
                cuts[starts[bisect.bisect_right(starts, int(v)) - 1]].add(int(v))
    for start, _, _ in spans:
        cuts[starts[bisect.bisect_right(starts, start) - 1]].add(start)
    for start, nbytes, _ in spans:
        for base in cuts:
            cuts[base] = {c for c in cuts[base] if not start < c < start + nbytes}

    out_at = {start: i for i, (start, _, _) in enumerate(spans)}
    # scratch: each allocation's pieces that are no output, laid out as they were (from its
    # first such piece to the end of its last), the allocations one after the other
    place: dict[int, int] = {}  # allocation base -> its first scratch byte's offset there
    scratch = 0
    for base, nbytes in allocations:
        ends = sorted(cuts[base]) + [base + nbytes]
        internal = [(a, b) for a, b in zip(ends, ends[1:]) if a not in out_at and b > a]
        if internal:
            first, last = internal[0][0], internal[-1][1]
            place[base] = scratch - (first - base)
            scratch += -(-(last - first) // ALIGN) * ALIGN

    def source(v: int) -> tuple[int, int, int]:
        for i, (start, nbytes) in enumerate(input_spans):
            if start <= v <= start + nbytes:
                return INPUT, _input_index(arrays, i), v - start
        base = starts[bisect.bisect_right(starts, v) - 1] if v >= _ALLOCATIONS else None
        if base is None or v > base + dict(allocations)[base]:
            raise RuntimeError(f"a launch argument {v:#x} points at memory the call did not "
                               "get from its inputs or allocate: it cannot be replayed")
        piece = max(c for c in cuts[base] if c <= v)
        if piece in out_at:
            return OUTPUT, out_at[piece], v - piece
        return SCRATCH, 0, place[base] + (v - base)

    launches = []
    for kernel, grid, block, values, shared, _ in recorded:
        pointers = tuple((at, *source(int(v)))
                         for at, (t, v) in enumerate(zip(kernel.types, values))
                         if t == "P" and int(v) != 0)
        driver = on_any_stream(kernel)
        driver.opt_in(shared)
        launches.append(_Launch(driver, grid, block, shared,
                                [0 if t == "P" else v for t, v in zip(kernel.types, values)],
                                pointers))
    return Program(launches, [(shape, np.dtype(np.float32)) for _, _, shape in spans], scratch)


def _three(dims: tuple) -> tuple[int, int, int]:
    """A grid or block as three dimensions (PyCUDA's launches take two for a grid)."""
    return (*dims, 1, 1)[:3]


def _input_index(arrays: list[Any], present: int) -> int:
    """The position among all inputs (absent ones included) of the ``present``-th given one."""
    return [i for i, a in enumerate(arrays) if a is not None][present]


def _span(picked: Any) -> tuple[int, int, tuple[int, ...]]:
    """(start, bytes, shape) of a float32 output array, or of a row of them laid back to
    back."""
    for part in picked if isinstance(picked, tuple) else (picked,):
        if part.dtype != np.float32:
            raise RuntimeError(f"an output of dtype {part.dtype}: programs hand out float32")
    if not isinstance(picked, tuple):
        return int(picked.gpudata), picked.nbytes, tuple(picked.shape)
    start = int(picked[0].gpudata)
    at = start
    for part in picked:
        if int(part.gpudata) != at:
            raise RuntimeError("the arrays of one output row are not laid back to back")
        at += part.nbytes
    return start, at - start, ((at - start) // 4,)

