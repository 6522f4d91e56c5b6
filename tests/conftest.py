"""GPU tests carry the ``gpu`` marker and skip cleanly where PyCUDA or a CUDA device is missing."""
import os
import time

import pytest

_STARTED = pytest.StashKey[float]()

# Synchronise after every launch in tests, so an asynchronous fault surfaces at its launch.
os.environ.setdefault("PYCUDA_HEADS_SYNC", "1")


def _checkout_tuning() -> None:
    """An installed package maps the checkout's tuning/ folder to pycuda_heads.tuning; a test
    run straight from a checkout gets the same mapping here."""
    import importlib.util
    import sys
    from pathlib import Path

    if importlib.util.find_spec("pycuda_heads.tuning") is not None:
        return
    folder = Path(__file__).resolve().parents[1] / "tuning"
    spec = importlib.util.spec_from_file_location(
        "pycuda_heads.tuning", folder / "__init__.py", submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["pycuda_heads.tuning"] = module
    spec.loader.exec_module(module)


_checkout_tuning()


def _skip_installed(items):
    """Tests that start the tuner in new processes skip where a fresh interpreter cannot import
    it (a checkout that was not installed)."""
    import subprocess
    import sys
    marked = [item for item in items if "installed" in item.keywords]
    if not marked or subprocess.run([sys.executable, "-c", "import pycuda_heads.tuning"],
                                    capture_output=True).returncode == 0:
        return
    skip = pytest.mark.skip(reason="starts the tuner in new processes: pip install -e '.[test]'")
    for item in marked:
        item.add_marker(skip)


def pytest_collection_modifyitems(config, items):
    _skip_installed(items)
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


def pytest_addoption(parser):
    parser.addoption("--gpu-record", action="store_true",
                     help="write reports/<gpu>/gpu_tests.json with this run's counts, commit "
                          "and date (only when the GPU tests ran)")


def pytest_sessionstart(session):
    session.config.stash[_STARTED] = time.time()


def pytest_sessionfinish(session, exitstatus):
    """The GPU test record: a run on the GPU is evidence only if its counts are kept."""
    # under pytest-xdist the controller holds every worker's results: it alone writes
    if not session.config.getoption("--gpu-record") or hasattr(session.config, "workerinput"):
        return
    import datetime
    import sys
    from pathlib import Path

    from pycuda_heads import records
    from pycuda_heads.core import device

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    counts = {k: len(reporter.stats.get(k, ())) for k in ("passed", "failed", "error", "skipped")}
    gpu_ran = any("gpu" in getattr(r, "keywords", {}) for r in reporter.stats.get("passed", ()))
    if not gpu_ran:
        reporter.write_line("--gpu-record: no GPU test passed, no record written")
        return
    root = Path(__file__).resolve().parents[1]
    state = records.git_state(root)
    record = {"gpu": device.gpu_name(), "commit": state["describe"], "date":
              datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              **counts, "seconds": round(time.time() - session.config.stash[_STARTED], 1),
              "exit_status": int(exitstatus),
              "command": "python -m pytest " + " ".join(sys.argv[1:])}
    path = root / "reports" / device.gpu_slug() / records.GPU_TESTS_JSON
    records.write_json(path, record)
    reporter.write_line(f"GPU test record written to {path}")
