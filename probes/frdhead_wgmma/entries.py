"""Some entries of a probe's rendered source: ptxas's resource report (CPU, nvcc only: what
the probes' ``--nvcc`` modes print before a GPU run), and the entries built for sm_90a with
their dynamic shared memory opted in (GPU)."""
from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterable

from pycuda_heads.core.compile import NVCC_OPTIONS, WGMMA_ARCH
from pycuda_heads.core.source import cu_dir


def report(source: str, entries: Iterable[str]) -> list[str]:
    """nvcc's return code, then per entry its registers and spills on sm_90a, then ptxas's
    warnings (C7515 and its kin: a wgmma pipeline ptxas serialized)."""
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
    out += [s for s in proc.stderr.splitlines() if "warning" in s or "(C75" in s]
    if proc.returncode:
        out += [s for s in proc.stderr.splitlines() if "error" in s][:5]
    return out


def functions(source: str, entries: Iterable[str], shared: int) -> dict[str, Any]:
    """The entries of ``source`` built for sm_90a, each allowed ``shared`` bytes of dynamic
    shared memory."""
    from pycuda.compiler import SourceModule

    from pycuda_heads.core import device
    with device.thread_context():
        module = SourceModule(source, no_extern_c=True, arch=WGMMA_ARCH,
                              include_dirs=[str(cu_dir())], options=list(NVCC_OPTIONS))
    out = {e: module.get_function(e) for e in entries}
    for fn in out.values():
        fn.set_attribute(device.cuda().function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
    return out
