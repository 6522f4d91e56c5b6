"""Static check of every prototype variant in run.py with plain nvcc (no GPU needed): registers,
stack and spills from ptxas, mma.sync count and atomic instructions in the PTX, and the shared
memory run.py computes against the kernel's own macro (a host program prints it).

    python probes/frdhead_mma/static_check.py [ARCH]        (default sm_90)
"""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("frdmma_run", HERE / "run.py")
run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run)


def variants() -> list[tuple[str, dict, str, int]]:
    out = []
    for n, k in run.FWD.items():
        for fused in (0, 1):
            out.append((f"fwd/{n}/{fused}", {**k, "FUSED": fused}, "FWD_SMEM_FLOATS",
                        run.fwd_smem(k)))
    for n, k in run.BWD.items():
        for st in (2, 1):
            if run.bwd_smem(k, st) <= run.MAX_SMEM:
                out.append((f"bwd/{n}/{st}", {**k, "STAGE": st}, "BWD_SMEM_FLOATS",
                            run.bwd_smem(k, st)))
    for n, k in run.STEP.items():
        out.append((f"step/{n}", k, "STEP_SMEM_FLOATS", run.step_smem(k)))
    out.append(("reduce", {"REDUCE": 1}, "", 0))
    return out


def main(arch: str = "sm_90") -> None:
    src = HERE / "frdhead_mma.cu"
    with tempfile.TemporaryDirectory() as tmp:
        for name, knobs, macro, smem in variants():
            d = [f"-D{k}={v}" for k, v in {**run.TEMPLATE, **knobs}.items()]
            r = subprocess.run(["nvcc", f"-arch={arch}", "-cubin", "-o", f"{tmp}/k.cubin",
                                "--resource-usage", *d, str(src)], capture_output=True, text=True)
            log = r.stdout + r.stderr
            subprocess.run(["nvcc", f"-arch={arch}", "-ptx", "-o", f"{tmp}/k.ptx", *d, str(src)],
                           check=True, capture_output=True)
            ptx = Path(f"{tmp}/k.ptx").read_text()
            regs = re.search(r"Used (\d+) registers", log)
            spill = re.search(r"(\d+) bytes spill stores", log)
            atoms = len(re.findall(r"^\s*(atom|red|cp\.reduce)\.", ptx, re.M))
            smem_ok = "-"
            if macro:  # the launch's shared bytes must be the kernel's own layout
                host = Path(tmp) / "h.cu"
                host.write_text(f'#include "{src}"\n#include <cstdio>\n'
                                f'int main() {{ printf("%d", (int)({macro})); }}\n')
                subprocess.run(["nvcc", f"-arch={arch}", *d, str(host), "-o", f"{tmp}/h"],
                               check=True, capture_output=True)
                got = 4 * int(subprocess.run([f"{tmp}/h"], capture_output=True, text=True).stdout)
                smem_ok = "ok" if got == smem else f"MISMATCH {got} != {smem}"
            print(f"{name:18s} rc={r.returncode} regs={regs and regs.group(1)} "
                  f"spill_bytes={spill and spill.group(1)} mma.sync={ptx.count('mma.sync')} "
                  f"atomics={atoms} smem={smem} ({smem_ok})")


if __name__ == "__main__":
    main(*sys.argv[1:])
