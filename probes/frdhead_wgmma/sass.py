"""SASS of one FrdHead variant (no GPU): ptxas's resources and warnings a kernel entry, and the
opcode counts of each entry's largest loop (the longest span from a backward branch's target to
the branch: the step or tile loop), to count a step's instructions before and after a kernel
edit. Needs `cuobjdump` on the PATH (pip install nvidia-cuda-cuobjdump).

    python probes/frdhead_wgmma/sass.py grad_w1 '{"WGMMA": 1, "BK": 16, ...}' [--dump F]
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import tempfile
from pathlib import Path

from pycuda_heads.catalog import SUITE_TEMPLATE, catalog
from pycuda_heads.core.compile import NVCC_OPTIONS, variant_arch
from pycuda_heads.core.source import render


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role")
    ap.add_argument("params", help="JSON: the point's knobs (the rest at the space's defaults)")
    ap.add_argument("--entry", help="the entry to read (default: every entry of the module)")
    ap.add_argument("--dump", type=Path, help="write the whole SASS here")
    a = ap.parse_args()
    spec = catalog()[f"frdhead.{a.role}"]
    params = {**spec.space.default, **json.loads(a.params)}
    constants = {**spec.template(SUITE_TEMPLATE), **params}
    arch = variant_arch(constants) or "sm_90"
    with tempfile.TemporaryDirectory() as tmp:
        cu, cubin = Path(tmp) / "v.cu", Path(tmp) / "v.cubin"
        cu.write_text(render(spec.family, constants, spec.source_dir))
        log = subprocess.run(["nvcc", *NVCC_OPTIONS, f"-arch={arch}", "-cubin", "-Xptxas", "-v",
                              "-o", str(cubin), str(cu)], capture_output=True, text=True)
        if log.returncode:
            raise SystemExit(log.stderr)
        print("\n".join(ln for ln in log.stderr.splitlines()  # an entry's lines follow its name
                        if any(w in ln for w in ("Compiling entry", "registers", "arning", "spill"))))
        sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True,
                              text=True, check=True).stdout
    if a.dump:
        a.dump.write_text(sass)
    for name, body in re.findall(r"Function : (\w+)\n(.*?)(?=\n\s+Function : |\Z)", sass, re.S):
        if a.entry and name != a.entry:
            continue
        ins = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", body)
        addr = [int(x, 16) for x, _ in ins]
        best = (0, 0, 0)
        for i, (_, text) in enumerate(ins):  # backward branches: loops
            tgt = re.search(r"0x([0-9a-f]+)", text) if "BRA" in text else None
            if tgt and int(tgt.group(1), 16) < addr[i]:
                j = addr.index(int(tgt.group(1), 16)) if int(tgt.group(1), 16) in addr else 0
                if i - j > best[0]:
                    best = (i - j, j, i)
        n, j, i = best
        ops = collections.Counter(t.split()[0].lstrip("@!P0123456789T").split(".")[0] or t.split()[1]
                                  for _, t in ins[j:i + 1])
        print(f"{name}: {len(ins)} instructions, largest loop {n} ({addr[j]:#x}..{addr[i]:#x}):")
        print("  " + ", ".join(f"{k} {v}" for k, v in ops.most_common(24)))


if __name__ == "__main__":
    main()
