"""GPU tests carry the ``gpu`` marker and skip cleanly where PyCUDA or a CUDA device is missing."""
import os

import pytest

# Synchronise after every launch in tests, so an asynchronous fault surfaces at its launch.
os.environ.setdefault("PYCUDA_HEADS_SYNC", "1")


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    from pycuda_heads.core.device import GpuUnavailableError, cuda
    try:
        cuda()
    except GpuUnavailableError as exc:
        skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {exc}")
        for item in gpu_items:
            item.add_marker(skip)
