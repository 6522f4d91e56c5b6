"""CUDA graphs of the library's launches. PyCUDA has no graph API, so capture, instantiation and
launch go through NVIDIA's driver bindings (``cuda.bindings.driver``, the ``cuda-bindings``
package), on the raw handle of a PyCUDA stream in the same (primary) context."""
from __future__ import annotations

from typing import Any, Callable

from .compile import capturing
from .device import bindings, checked


class Graph:
    """The launches ``record(stream)`` makes on ``stream``, captured once; ``launch`` replays
    them all with one call. Buffers they touch must stay where they were at capture."""

    def __init__(self, record: Callable[[Any], Any], stream: Any) -> None:
        cu = bindings()
        self._cu = cu
        handle = cu.CUstream(stream.handle)
        checked(cu.cuStreamBeginCapture(
            handle, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
            "cuStreamBeginCapture")
        try:
            with capturing():
                record(stream)
        except BaseException:
            # end the capture, so the stream is usable again, and drop what it held: the
            # recording's error is the one raised
            ended = cu.cuStreamEndCapture(handle)
            if int(ended[0]) == 0:
                cu.cuGraphDestroy(ended[1])
            raise
        graph = checked(cu.cuStreamEndCapture(handle), "cuStreamEndCapture")
        self._graph = graph
        self._exec = checked(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")

    def launch(self, stream: Any) -> None:
        checked(self._cu.cuGraphLaunch(self._exec, self._cu.CUstream(stream.handle)),
            "cuGraphLaunch")

    def __del__(self) -> None:
        cu = getattr(self, "_cu", None)
        if cu is not None:
            if getattr(self, "_exec", None) is not None:
                cu.cuGraphExecDestroy(self._exec)
            if getattr(self, "_graph", None) is not None:
                cu.cuGraphDestroy(self._graph)
