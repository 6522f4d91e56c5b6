"""Instruction mix of one pool (or any family's) variant from its SASS, without a GPU: renders
the variant, builds a cubin with nvcc for sm_90, disassembles it with cuobjdump and counts the
static instructions of each entry by opcode (loops are counted once, so this says what a
change adds or removes, not what runs).

    python probes/sass/mix.py KERNEL 'TEMPLATE_JSON' 'PARAMS_JSON' [--dump FILE]

cuobjdump is not in the CUDA image of CI; `pip install nvidia-cuda-cuobjdump` gives it
(nvidia/cu13/bin/cuobjdump), or set CUOBJDUMP.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

from pycuda_heads.catalog import catalog
from pycuda_heads.core.compile import NVCC_OPTIONS
from pycuda_heads.core.source import render

_INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]+)?")
_FUNC = re.compile(r"Function : (\w+)")


def sass(kernel: str, template: dict, params: dict) -> str:
    spec = catalog()[kernel]
    constants = {**spec.template(template), **params}
    source = render(spec.family, constants, spec.source_dir)
    tool = os.environ.get("CUOBJDUMP", "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        cu, cubin = Path(tmp) / "v.cu", Path(tmp) / "v.cubin"
        cu.write_text(source)
        subprocess.run(["nvcc", *NVCC_OPTIONS, "-arch=sm_90", "-cubin", "-o", str(cubin), str(cu)],
                       check=True)
        return subprocess.run([tool, "-sass", str(cubin)], check=True, capture_output=True,
                              text=True).stdout


def mix(text: str) -> dict[str, collections.Counter]:
    out: dict[str, collections.Counter] = {}
    cur = None
    for line in text.splitlines():
        if m := _FUNC.search(line):
            cur = out.setdefault(m.group(1), collections.Counter())
        elif cur is not None and (m := _INSN.search(line)):
            cur[m.group(1)] += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kernel")
    ap.add_argument("template")
    ap.add_argument("params")
    ap.add_argument("--dump")
    a = ap.parse_args()
    text = sass(a.kernel, json.loads(a.template), json.loads(a.params))
    if a.dump:
        Path(a.dump).write_text(text)
    for entry, c in mix(text).items():
        print(f"{entry}: {sum(c.values())} instructions")
        print("  " + ", ".join(f"{k} {v}" for k, v in c.most_common(30)))


if __name__ == "__main__":
    main()
