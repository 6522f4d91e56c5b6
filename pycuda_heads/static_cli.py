"""``pycuda-heads check``: the static check (plain nvcc, no GPU) of the kernels' variants."""
from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .registry import KERNELS, KernelInfo, static_check
from .static_check import DEFAULT_ARCHS, StaticReport


def jobs(everything: bool, archs: tuple[str, ...]) -> list[tuple[KernelInfo, dict, str]]:
    """Default variants on every arch; with ``everything`` each space point on sm_90 too."""
    out = [(info, dict(info.space.default), arch) for info in KERNELS.values() for arch in archs]
    if everything:
        out += [(info, p, "sm_90") for info in KERNELS.values()
                for p in info.space.points(info.template()) if p != dict(info.space.default)]
    return out


def run_checks(todo: list[tuple[KernelInfo, dict, str]], workers: int = 4) -> list[StaticReport]:
    with ThreadPoolExecutor(workers) as pool:  # nvcc runs as subprocesses
        return list(pool.map(lambda j: static_check(*j), todo))


def _run(args: argparse.Namespace) -> int:
    todo = jobs(args.all, tuple(args.arch))
    reports = run_checks(todo, args.jobs)
    bad = 0
    for (info, params, arch), rep in zip(todo, reports):
        res = next(iter(rep.entries.values()), None)
        if rep.ok and not args.verbose_ok and params != dict(info.space.default):
            continue
        bad += not rep.ok
        regs = f"{res.registers:3d} regs {res.stack_bytes:4d} B stack" if res else "no entry"
        status = "ok  " if rep.ok else "FAIL"
        print(f"{status} {info.name:<20} {arch} {regs} {params}"
              + ("" if rep.ok else f"  {'; '.join(rep.problems())}"))
    print(f"{len(reports) - bad}/{len(reports)} variants free of atomics and spills")
    return 1 if bad else 0


def register(sub: Any) -> None:
    p = sub.add_parser("check", help="static check with nvcc: no atomics, registers, spills")
    p.add_argument("--arch", nargs="+", default=list(DEFAULT_ARCHS), help="SM targets")
    p.add_argument("--all", action="store_true", help="also every point of every search space")
    p.add_argument("--jobs", type=int, default=4, help="parallel nvcc processes")
    p.add_argument("--verbose-ok", action="store_true", help="list passing space points too")
    p.set_defaults(func=_run)
