"""How results are named and written, for every layer: shape labels, GPU slugs, file names in
``reports/<gpu>/``, git state and crash-safe writes. Imports nothing of the package."""
from __future__ import annotations

import glob
import json
import os
import re
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

#: the library's version: the package's `__version__`, setup.cfg's and every bench row's
VERSION = "0.1.0"

# Files of one GPU's folder under reports/.
BENCH_CSV = "bench.csv"
VALIDATION_JSON = "validation.json"
GPU_TESTS_JSON = "gpu_tests.json"
PHASES_JSON = "phases.json"
SMOKE_JSON = "smoke_training.json"
TUNING_DIR = "tuning"
EFFICIENCY_JSON = "efficiency.json"
# the quality measurement: a reference record per task in REFERENCE_DIR, the curves in QUALITY_JSON
REFERENCE_DIR = "reference"
QUALITY_JSON = "quality.json"
RUNS_JSON = "runs.json"
JOURNAL = "optuna.journal"
# A tuning cache is named <kernel>__<template>__<shape>.json.
CACHE_GLOB = "*__*__*.json"
# Environment variable naming the commit to record, for a tree copied without its git history.
COMMIT_ENV = "PYCUDA_HEADS_COMMIT"
# A timing whose p80/p20 spread is above this is noisy: the bench measures it again, and the
# report marks it if it stays so.
NOISY_SPREAD = 1.5
# The pass name of a forward and backward timed together, and of a forward fused with its loss
# (``KernelSpec.fuses``) timed with the backward.
FWD_BWD = "fwd+bwd"
FWD_LOSS_BWD = "fwd+loss+bwd"
# Bench providers beside the library's and the peers': a fused pass's kernels run unfused (the
# tuned ops one after the other), and the time the pass's matrix products take at the tensor
# cores' measured rate.
SEPARATE = "separate"
COMPUTE_FLOOR = "compute_floor"
# Bench ops beside the kernel families, written by perf and read by report: the composed head
# step, and the empty kernel launch (its own provider too) the small shapes are measured against.
STEP_OP = "step"
#: the bench's PyTorch training steps (``perf.torch_train``)
TORCH_TRAIN_OP = "torch_train"
#: the whole head's training step (``perf.train_bench``), and its multi-tensor Adam alone
TRAIN_STEP_OP = "train_step"
TRAIN_ADAM_OP = "train_step_adam"
EMPTY_KERNEL = "empty_kernel"


def dims_label(dims: Mapping[str, Any]) -> str:
    """'B=4096,K=256' (keys sorted); 'none' for no entries. The one spelling of a shape or a
    set of template constants in files, studies, tables and plots."""
    return ",".join(f"{k}={int(dims[k])}" for k in sorted(dims)) or "none"


def parse_dims(text: str) -> dict[str, int]:
    """'B=4096,K=256' -> {'B': 4096, 'K': 256}; ValueError naming what is wrong."""
    out: dict[str, int] = {}
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts):
        raise ValueError(f"expected NAME=INT pairs separated by commas, got {text!r}")
    for part in parts:
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not key or not re.fullmatch(r"[A-Za-z_]\w*", key):
            raise ValueError(f"expected NAME=INT pairs separated by commas, got {text!r}")
        try:
            out[key] = int(value)
        except ValueError:
            raise ValueError(f"{key} must be an integer in {text!r}, got {value.strip()!r}") \
                from None
    return out


def slug(text: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200': folder, table and plot file names."""
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")


def git_state(where: Path | str | None = None) -> dict[str, Any]:
    """``{"commit": full hash or None, "describe": short hash (+ '-dirty'), "dirty": bool or
    None}`` of the checkout holding ``where`` (this package when None)."""
    where = Path(where or Path(__file__).resolve().parent)

    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", "-C", str(where), *args], capture_output=True,
                                  text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    pinned = os.environ.get(COMMIT_ENV)
    if pinned:  # a copied tree whose git metadata is not the code's
        return {"commit": pinned, "describe": pinned, "dirty": False}
    status = git("status", "--porcelain")
    return {"commit": git("rev-parse", "HEAD"),
            "describe": git("describe", "--always", "--dirty") or "unknown",
            "dirty": None if status is None else bool(status)}


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it: once, at import
    os.umask(mask)
    return mask


_UMASK = _umask()


#: a temporary file of another machine's writer (or of an older, unnamed one) this much older
#: than now was left by a killed writer: no write takes that long
STALE_TMP_S = 600.0
_HOST = socket.gethostname()


def _remove_stale_tmp(path: Path) -> None:
    """Delete the temporary files of ``path`` that killed writers left: those of a dead pid on
    this machine, and any others older than ``STALE_TMP_S``. A live writer's is kept."""
    prefix = f".{path.name}."
    mine = f"{_HOST}-"
    for tmp in path.parent.glob(f"{glob.escape(prefix)}*.tmp"):
        # .<name>.<host>-<pid>.<random>.tmp; the random part of mkstemp holds no dot
        tag = tmp.name[len(prefix):-len(".tmp")].rpartition(".")[0]
        pid = tag[len(mine):] if tag.startswith(mine) else ""
        try:
            if pid.isdigit():
                stale = not pid_alive(int(pid))
            else:
                stale = time.time() - tmp.stat().st_mtime > STALE_TMP_S
            if stale:
                tmp.unlink()
        except OSError:  # another writer removed or renamed it first
            pass


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine still runs. A zombie counts as dead: it is gone
    but for its exit status, which a parent waiting on another child may not collect for hours
    (``os.kill(pid, 0)`` alone calls it alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: os.kill's answer stands
    # the state follows the command name, which is in parentheses and may hold any character
    return stat.rpartition(")")[2].split()[:1] not in (["Z"], ["X"])


def write_text(path: Path | str, text: str) -> None:
    """Write ``text`` so that a reader sees the old file or the new one, never a part: a unique
    temporary name in the same folder, fsync, then rename. Concurrent writers never collide.
    The temporary name carries the writer's host and pid, so that a later write removes the
    temporary file a killed writer left (``_remove_stale_tmp``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{_HOST}-{os.getpid()}.", suffix=".tmp",
                               dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; a results file is for everyone
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(path: Path | str, data: Any, indent: int | None = 1) -> None:
    write_text(path, json.dumps(data, indent=indent, default=float) + "\n")


def read_json(path: Path | str, what: str = "file") -> Any:
    """The JSON in ``path``; a ValueError naming the file when it is not valid JSON."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{what} {path} is not valid JSON ({exc}); delete or restore it") \
            from None


def log_phase(gpu_dir: Path | str, phase: str, started: float, status: int,
              subset: str = "") -> None:
    """Append one main-job phase (sweep, export, validate, bench, report) and its wall time,
    from ``started`` (``time.time()``) to now, to ``<gpu_dir>/phases.json``. ``subset`` names
    the part of the phase a narrowed run did (e.g. "kernels pool.forward"); empty: all of it."""
    import datetime as dt
    path = Path(gpu_dir) / PHASES_JSON
    try:
        phases = read_json(path, "phase log") if path.is_file() else []
    except ValueError:
        phases = []
    phases.append({"phase": phase, "status": int(status),
                   "started": dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(
                       timespec="seconds"),
                   "seconds": round(time.time() - started, 1),
                   **({"subset": subset} if subset else {})})
    write_json(path, phases)


def name_list(choices: Iterable[str], what: str) -> Callable[[str], list[str]]:
    """A command-line argument type: comma-separated names, each one of ``choices``, else the
    one-line argparse error that names the value (the same form on every command:
    ``--kernels a,b``)."""
    import argparse
    allowed = sorted(choices)

    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",")]
        bad = [n for n in names if n not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {what} among {', '.join(allowed)}; got {text!r}")
        return list(dict.fromkeys(names))
    return parse


def slugs(text: str) -> list[str]:
    """A command-line argument type: comma-separated GPU slugs (``--gpu a,b``)."""
    return [n.strip() for n in text.split(",") if n.strip()]


def int_at_least(low: int) -> Callable[[str], int]:
    """A command-line argument type: an integer of at least ``low``, else the one-line
    argparse error that names the value."""
    import argparse

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
        return value
    return parse
