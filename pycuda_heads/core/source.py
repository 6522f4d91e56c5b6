"""Kernel sources: where the .cu files live and how a variant's source is rendered.

A variant is (kernel family, constants): the family names ``cu/<family>.cu``; the constants
(template constants such as N_HORIZONS and launch knobs such as BLOCK) become a ``#define``
prelude. Every header the family includes (``#include "name.cuh"``, looked up beside the family's
``.cu`` and then in the package's ``cu/``, nested includes too) is inlined once, so the rendered
text is self-contained: it is what SourceModule compiles on the GPU, what the static check
compiles with plain nvcc, and (rendered with no constants) what the family's source hash covers.
"""
from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

COMMON_HEADER = "heads_common.cuh"
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"[ \t]*(?://[^\n]*)?$', re.M)
# Prepared-call type letters of the C parameter types the kernels use.
_ARG_TYPES = {"float*": "P", "int*": "P", "long long*": "P", "float": "f", "int": "i",
              "long long": "q", "unsigned int": "I", "double": "d"}


def cu_dir() -> Path:
    """The folder holding the .cu sources: inside the installed package, else the checkout's cu/."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "cu", here.parent / "cu"):
        if (candidate / COMMON_HEADER).is_file():
            return candidate
    raise FileNotFoundError(f"pycuda-heads: no CUDA sources found in {here / 'cu'} or "
                            f"{here.parent / 'cu'}; the installation is incomplete")


@lru_cache(maxsize=None)
def _read(path: Path) -> str:
    return path.read_text()


def family_source(family: str, source_dir: Path | None = None) -> str:
    """``<family>.cu`` with every header it includes inlined (no constants yet)."""
    folder = Path(source_dir) if source_dir is not None else cu_dir()
    path = folder / f"{family}.cu"
    if not path.is_file():
        known = sorted(p.stem for p in folder.glob("*.cu"))
        raise ValueError(f"unknown kernel family {family!r}: no {path}; found {known}")
    return _inline(_read(path), (folder, cu_dir()), set())


def _inline(text: str, folders: tuple[Path, ...], seen: set[str]) -> str:
    """``text`` with each quoted include replaced by the header's own text, inlined likewise;
    a header already inlined becomes an empty line (every header is included once)."""
    def header(m: re.Match) -> str:
        name = m.group(1)
        if name in seen:
            return ""
        seen.add(name)
        path = next((f / name for f in folders if (f / name).is_file()), None)
        if path is None:
            raise FileNotFoundError(f"#include \"{name}\": not in {', '.join(map(str, folders))}")
        return _inline(_read(path), folders, seen)
    return _INCLUDE.sub(header, text)


def render(family: str, constants: Mapping[str, Any], source_dir: Path | None = None) -> str:
    """Self-contained CUDA source of one variant."""
    prelude = "".join(f"#define {k} {int(v)}\n" for k, v in sorted(constants.items()))
    return f"// pycuda-heads variant of {family}\n{prelude}{family_source(family, source_dir)}"


def signature(source: str, entry: str) -> tuple[tuple[str, str], ...]:
    """(name, prepared-call type letter) of each parameter of ``entry``, read from its
    ``extern "C"`` signature: the one place a kernel's argument order is written."""
    # launch bounds, written out or through an upper-case macro
    m = re.search(r'extern\s+"C"\s+__global__\s+void\s+'
                  r'(?:__launch_bounds__\s*\([^)]*\)\s*|[A-Z][A-Z0-9_]*\s+)?'
                  + re.escape(entry) + r"\s*\(([^)]*)\)", source)
    if m is None:
        raise ValueError(f'no extern "C" __global__ entry {entry!r} in the source')
    params = m.group(1).strip()
    # the list written once as an upper-case macro that kernels share: its #define's body
    if re.fullmatch(r"[A-Z][A-Z0-9_]*", params):
        d = re.search(r"^[ \t]*#define[ \t]+" + params + r"[ \t]*((?:.*\\\n)*.*)$",
                      source, re.M)
        if d is None:
            raise ValueError(f"{entry}: parameter list {params} is not #defined in the source")
        params = d.group(1).replace("\\\n", " ")
    out = []
    for param in filter(None, (p.strip() for p in params.split(","))):
        name = re.search(r"(\w+)\s*$", param).group(1)
        ctype = re.sub(r"\b(?:const|__restrict__|volatile)\b", " ", param[:-len(name)])
        ctype = re.sub(r"\s+", " ", ctype).replace(" *", "*").strip()
        if ctype not in _ARG_TYPES:
            raise ValueError(f"{entry}: parameter {param!r} has a type this library cannot "
                             f"pass ({ctype!r})")
        out.append((name, _ARG_TYPES[ctype]))
    return tuple(out)


def arg_types(source: str, entry: str) -> str:
    """PyCUDA prepared-call types of ``entry``, read from its ``extern "C"`` signature."""
    return "".join(t for _, t in signature(source, entry))


def variant_hash(source: str, options: tuple[str, ...] = ()) -> str:
    """Stable identity of a compiled variant: its rendered source and compiler options."""
    return hashlib.sha256("\0".join((source, *options)).encode()).hexdigest()[:16]
