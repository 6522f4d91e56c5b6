"""Static check of a rendered variant with plain nvcc (no GPU, no PyCUDA needed), and the
``pycuda-heads check`` command.

Compiles to PTX, rejects any atomic or reduction-to-memory instruction, assembles with
``ptxas -v`` and reads registers, stack frame, spills and shared memory per kernel entry.
Results are cached on disk by variant hash, architecture and nvcc version.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from .. import records
from ..catalog import SUITE_TEMPLATE, Catalog, catalog
from ..core.compile import NVCC_OPTIONS, cache_dir, variant_arch
from ..core.device import GpuUnavailableError, driver_devices
from ..core.source import render, variant_hash
from ..core.spec import KernelSpec
from ..progress import Steps

DEFAULT_ARCHS = ("sm_90", "sm_80", "sm_86", "sm_89")
# atom.* and red.* (also multimem.red, cp.reduce.async.bulk): anything that lets two writers merge.
_ATOMIC = re.compile(r"^\s*(?:@!?%\w+\s+)?((?:multimem\.)?(?:atom|red)\.\S*|cp\.reduce\.\S*)", re.M)
_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


class NvccUnavailableError(RuntimeError):
    """nvcc/ptxas are not on the PATH."""


@dataclass
class EntryResources:
    registers: int = 0
    stack_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    static_shared_bytes: int = 0


@dataclass
class StaticReport:
    family: str
    constants: dict[str, int]
    arch: str
    variant: str
    atomics: list[str] = field(default_factory=list)
    entries: dict[str, EntryResources] = field(default_factory=dict)
    #: nvcc's warnings on the variant: a user's compile would print each of them
    warnings: list[str] = field(default_factory=list)

    @property
    def spills(self) -> bool:
        return any(e.spill_store_bytes or e.spill_load_bytes for e in self.entries.values())

    @property
    def ok(self) -> bool:
        return not self.atomics and not self.spills and not self.warnings and bool(self.entries)

    def problems(self) -> list[str]:
        out = [f"atomic instruction {a}" for a in self.atomics]
        out += [f"{name} spills {e.spill_store_bytes} B stores / {e.spill_load_bytes} B loads"
                for name, e in self.entries.items() if e.spill_store_bytes or e.spill_load_bytes]
        out += [f"nvcc: {w}" for w in self.warnings]
        if not self.entries:
            out.append("no kernel entry was compiled")
        return out

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "problems": self.problems()}


@lru_cache(maxsize=None)
def nvcc_version() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None or shutil.which("ptxas") is None:
        raise NvccUnavailableError("the static check needs nvcc and ptxas on the PATH")
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


def parse_ptxas(log: str) -> dict[str, EntryResources]:
    """Per-entry resources from ``ptxas -v`` output."""
    entries: dict[str, EntryResources] = {}
    current = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = entries.setdefault(m.group(1), EntryResources())
        elif current is None:
            continue
        elif m := _FRAME.search(line):
            current.stack_bytes, current.spill_store_bytes, current.spill_load_bytes = map(int, m.groups())
        elif m := _USED.search(line):
            current.registers = int(m.group(1))
            if s := _SMEM.search(line):
                current.static_shared_bytes = int(s.group(1))
    return entries


def find_atomics(ptx: str) -> list[str]:
    return sorted(set(m.group(1) for m in _ATOMIC.finditer(ptx)))


def check_variant(family: str, constants: Mapping[str, Any], arch: str = "sm_90",
                  entries: tuple[str, ...] | None = None,
                  source_dir: Path | None = None) -> StaticReport:
    """Compile one variant for ``arch`` (a variant that needs its own, ``variant_arch``, for
    that one) and report atomics (anywhere in the module) and the resources of ``entries``
    (every entry when None)."""
    report = _check(family, constants, variant_arch(constants) or arch, source_dir)
    if entries is not None:
        report.entries = {k: v for k, v in report.entries.items() if k in entries}
    return report


def check_kernel(spec: KernelSpec, params: Mapping[str, Any], arch: str = "sm_90",
                 template: Mapping[str, Any] | None = None) -> StaticReport:
    """The static report of one point of ``spec``'s space (the resources of the entries it
    launches)."""
    constants = {**spec.template(template or SUITE_TEMPLATE), **params}
    return check_variant(spec.family, constants, arch, spec.entries(params), spec.source_dir)


def _check(family: str, constants: Mapping[str, Any], arch: str,
           source_dir: Path | None) -> StaticReport:
    source = render(family, constants, source_dir)
    key = variant_hash(source, (*NVCC_OPTIONS, arch, nvcc_version()))
    cached = cache_dir("static") / f"{key}.json"
    report = StaticReport(family, {k: int(v) for k, v in constants.items()}, arch, key)
    data = json.loads(cached.read_text()) if cached.is_file() else {}
    if "warnings" in data:  # a result of before warnings were kept is made again
        report.atomics, report.warnings = data["atomics"], data["warnings"]
        report.entries = {k: EntryResources(**v) for k, v in data["entries"].items()}
        return report
    compute = arch.replace("sm_", "compute_")
    with tempfile.TemporaryDirectory(prefix="pycuda-heads-") as tmp:
        cu, ptx = Path(tmp) / "variant.cu", Path(tmp) / "variant.ptx"
        cu.write_text(source)
        try:
            log = _run(["nvcc", *NVCC_OPTIONS, f"-arch={compute}", "--ptx", "-o", str(ptx),
                        str(cu)], family)
        except RuntimeError as exc:
            raise RuntimeError(_explain(str(exc), family, constants)) from None
        report.warnings = [line.strip() for line in log.splitlines()
                           if "warning" in line and not line.startswith("Remark")]
        text = ptx.read_text()
        report.atomics = find_atomics(text)
        log = _run(["ptxas", f"-arch={arch}", "-v", "-o", str(Path(tmp) / "v.cubin"), str(ptx)], family)
        report.entries = parse_ptxas(log)
    records.write_json(cached, {"atomics": report.atomics, "warnings": report.warnings,
                                "entries": {k: asdict(v) for k, v in report.entries.items()}})
    return report


_UNDEFINED = re.compile(r'identifier "([A-Z][A-Z0-9_]*)" is undefined')


def _explain(error: str, family: str, constants: Mapping[str, Any]) -> str:
    """nvcc's error, led by the rule it most likely broke: a variant is ``<family>.cu`` with
    only its own kernel's template constants and launch knobs defined, so an entry that uses
    a knob of another kernel of the family fails in every variant of the others."""
    missing = sorted(set(_UNDEFINED.findall(error)) - set(constants))
    if not missing:
        return error
    return (f"{family}.cu uses {', '.join(missing)}, which this variant does not define (it "
            f"defines {', '.join(sorted(constants)) or 'nothing'}). Each variant compiles the "
            f"whole file with its own kernel's knobs alone: wrap an entry that uses another "
            f"kernel's knob in `#ifdef {missing[0]}` ... `#endif`, or give the knob to every "
            f"kernel of the family.\n{error}")


def _run(cmd: list[str], family: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed on {family}:\n{proc.stderr.strip()}")
    return proc.stdout + proc.stderr


Job = tuple[KernelSpec, dict, str]


def jobs(cat: Catalog, everything: bool, archs: tuple[str, ...]) -> list[Job]:
    """Default variants on every arch; with ``everything`` each space point on sm_90 too."""
    out = [(spec, dict(spec.space.default), arch) for spec in cat for arch in archs]
    if everything:
        out += [(spec, p, "sm_90") for spec in cat
                for p in spec.space.points(spec.template(SUITE_TEMPLATE))
                if p != dict(spec.space.default)]
    return out


def run_checks(todo: list[Job], workers: int = 4) -> list[StaticReport]:
    """Every job's report, in order, with its progress (``check --all`` compiles thousands of
    variants)."""
    out = []  # threads: nvcc runs as subprocesses
    with ThreadPoolExecutor(workers) as pool, Steps(len(todo), "check", "variant") as steps:
        for (spec, _, arch), report in zip(todo, pool.map(lambda j: check_kernel(*j), todo)):
            out.append(report)
            steps.step(f"{spec.id} {arch}")
    return out


def _cli(args: argparse.Namespace) -> int:
    if args.device:
        try:
            print(f"{driver_devices()} CUDA device(s)")
        except GpuUnavailableError as exc:
            print(f"pycuda-heads check: no GPU to run on, {exc}: the GPU commands need an "
                  "NVIDIA GPU with its driver, and PyCUDA's build the CUDA toolkit",
                  file=sys.stderr)
            return 2
    try:
        nvcc_version()
    except NvccUnavailableError as exc:
        print(f"pycuda-heads check: {exc} (install the CUDA toolkit)", file=sys.stderr)
        return 2
    # an arch this nvcc lacks would fail every compile in nvcc's own words, over many lines;
    # an nvcc too old to list its archs (empty list) is left to fail that way
    listed = subprocess.run(["nvcc", "--list-gpu-code"], capture_output=True,
                            text=True).stdout.split()
    unsupported = [a for a in args.arch if listed and a.rstrip("af") not in listed]
    if unsupported:
        print(f"pycuda-heads check: --arch {' '.join(unsupported)}: not supported by this nvcc; "
              f"it supports {' '.join(listed)}", file=sys.stderr)
        return 2
    todo = jobs(catalog(), args.all, tuple(args.arch))
    reports = run_checks(todo, args.jobs)
    bad = 0
    for (spec, params, arch), rep in zip(todo, reports):
        res = next(iter(rep.entries.values()), None)
        if rep.ok and not args.verbose_ok and params != dict(spec.space.default):
            continue
        bad += not rep.ok
        regs = f"{res.registers:3d} regs {res.stack_bytes:4d} B stack" if res else "no entry"
        status = "ok  " if rep.ok else "FAIL"
        print(f"{status} {spec.id:<20} {arch} {regs} {params}"
              + ("" if rep.ok else f"  {'; '.join(rep.problems())}"))
    print(f"{len(reports) - bad}/{len(reports)} variants free of atomics and spills")
    return 1 if bad else 0


def _arch(text: str) -> str:
    if not re.fullmatch(r"sm_\d{2,3}[af]?", text):
        raise argparse.ArgumentTypeError(f"expected an SM target such as sm_90, got {text!r}")
    return text


_positive = records.int_at_least(1)


def register(sub: Any) -> None:
    p = sub.add_parser("check", help="static check with nvcc: no atomics, registers, spills")
    p.add_argument("--arch", nargs="+", type=_arch, default=list(DEFAULT_ARCHS),
                   help="SM targets")
    p.add_argument("--all", action="store_true", help="also every point of every search space")
    p.add_argument("--jobs", type=_positive, default=4, help="parallel nvcc processes")
    p.add_argument("--verbose-ok", action="store_true", help="list passing space points too")
    p.add_argument("--device", action="store_true",
                   help="first check that this machine has a CUDA GPU for the GPU commands "
                        "(through the driver: PyCUDA need not be installed)")
    p.set_defaults(func=_cli)
