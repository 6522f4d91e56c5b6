"""The tuning run's view of the current GPU: name, slug, architecture, shared-memory limit,
and the warm-up step that compiles every variant about to be timed."""
from __future__ import annotations

from dataclasses import dataclass

from pycuda_heads import device
from pycuda_heads.source import render
from pycuda_heads.space import Point

from .precompile import compile_all
from .task import TuningTask


@dataclass(frozen=True)
class GpuContext:
    name: str
    slug: str
    arch: str
    max_shared_bytes: int

    @classmethod
    def current(cls) -> "GpuContext":
        """Raises GpuUnavailableError without PyCUDA or a device."""
        major, minor = device.compute_capability()
        return cls(device.gpu_name(), device.gpu_slug(), f"sm_{major}{minor}",
                   device.max_shared_bytes())

    def precompile(self, items: list[tuple[TuningTask, Point]], workers: int) -> int:
        sources = [render(task.family, {**task.template, **point}) for task, point in items]
        return compile_all(sources, self.arch, workers)
