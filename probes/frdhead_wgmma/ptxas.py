"""ptxas's resource report of some entries of a rendered source (CPU, nvcc only): what the
probes' ``--nvcc`` modes print before a GPU run."""
from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Iterable

from pycuda_heads.core.compile import NVCC_OPTIONS
from pycuda_heads.core.source import cu_dir


def report(source: str, entries: Iterable[str]) -> list[str]:
    """nvcc's return code, then per entry its registers and spills on sm_90a."""
    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(tmp) / "v.cu"
        cu.write_text(source)
        proc = subprocess.run(
            ["nvcc", *NVCC_OPTIONS, "-cubin", "-Xptxas", "-v", f"-I{cu_dir()}",
             "-gencode=arch=compute_90a,code=sm_90a", "-o", str(Path(tmp) / "v.cubin"),
             str(cu)], capture_output=True, text=True)
    wanted, current, out = set(entries), None, [f"nvcc rc {proc.returncode}"]
    for line in proc.stderr.splitlines():
        if "Compiling entry function" in line:
            current = line.split("'")[1]
        elif current in wanted and ("Used" in line or "spill" in line):
            out.append(f"{current}: {line.split(':', 1)[-1].strip()}")
    if proc.returncode:
        out += [s for s in proc.stderr.splitlines() if "error" in s][:5]
    return out
