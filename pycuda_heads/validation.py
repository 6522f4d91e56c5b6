"""The GPU validation record ``reports/<gpu-slug>/validation.json`` and ``pycuda-heads validate``.

Each variant (the default launch parameters of every kernel, and every entry of the shipped tuned
table for this GPU) runs ``checks.validate_case`` over a grid of shapes; the record keeps, per
variant, what was checked, the errors, pass/fail and the hash of its rendered source, and the
hash of all kernel sources. A CPU test fails when the sources change without a new record.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from .registry import KERNELS, SUITE_TEMPLATE
from .source import render, sources_hash, variant_hash
from .suite import SUITE

# Odd shapes beside the suite: K=1, K not a multiple of the block, K in the thousands, B=1, H=1,
# D=64 and 256, other atom counts. (template overrides, shape)
_POOL_GRID = [({}, {"B": 1, "K": 1}), ({}, {"B": 3, "K": 33}), ({}, {"B": 2, "K": 257}),
              ({}, {"B": 2, "K": 4096}), ({"N_HORIZONS": 1}, {"B": 4, "K": 16}),
              ({"HIDDEN_DIM": 64}, {"B": 3, "K": 20}), ({"HIDDEN_DIM": 256}, {"B": 2, "K": 40}),
              ({"N_HORIZONS": 3, "HIDDEN_DIM": 96}, {"B": 2, "K": 77})]
_ROW_GRID = [({}, {"B": 1}), ({}, {"B": 7}), ({}, {"B": 1000}), ({"N_HORIZONS": 1}, {"B": 5}),
             ({"HIDDEN_DIM": 64}, {"B": 9}), ({"HIDDEN_DIM": 256}, {"B": 9})]
GRID: dict[str, list[tuple[dict[str, int], dict[str, int]]]] = {
    "pool.forward": _POOL_GRID,
    "pool.backward": _POOL_GRID,
    "residual.forward": _ROW_GRID,
    "residual.backward": _ROW_GRID,
    "gate.forward": [({}, {"B": 1}), ({}, {"B": 1000}), ({"N_HORIZONS": 1}, {"B": 7})],
    "gate.backward": [({}, {"B": 1}), ({}, {"B": 1000}), ({"N_HORIZONS": 1}, {"B": 7}),
                      ({}, {"B": 100000})],
    "frd.softmax_ce_grad": [({}, {"B": 1}), ({}, {"B": 3}), ({"N_ATOMS": 11}, {"B": 37}),
                            ({"N_ATOMS": 51}, {"B": 37}), ({"N_HORIZONS": 1}, {"B": 5})],
    "reduce_axis0": [({}, {"N": 1, "M": 1}), ({}, {"N": 1, "M": 640}), ({}, {"N": 7, "M": 3}),
                     ({}, {"N": 5000, "M": 33}), ({}, {"N": 300000, "M": 5})],
}


def grid(kernel: str) -> list[tuple[dict[str, int], dict[str, int]]]:
    """(template, shape) pairs a default variant is validated on: the odd grid and the suite."""
    info = KERNELS[kernel]
    pairs = [(info.template({**SUITE_TEMPLATE, **over}), shape) for over, shape in GRID[kernel]]
    return pairs + [(info.template(SUITE_TEMPLATE), dict(s)) for s in SUITE[kernel]]


def variant_record(kernel: str, params: Mapping[str, Any], source: str,
                   shapes: Iterable[tuple[dict[str, int], dict[str, int]]]) -> dict[str, Any]:
    from .cases import Case
    from .checks import validate_case
    info = KERNELS[kernel]
    runs = []
    for template, shape in shapes:
        result = validate_case(Case(kernel, shape, params, template))
        runs.append({"template": template, "shape": shape, **result})
    rel = [r["max_rel_err"] for r in runs if r["max_rel_err"] is not None]
    suite_template = info.template(SUITE_TEMPLATE)
    return {"kernel": kernel, "source": source, "template": suite_template, "params": dict(params),
            "variant_hash": variant_hash(render(info.family, {**suite_template, **params})),
            "passed": all(r["passed"] for r in runs), "max_rel_err": max(rel) if rel else None,
            "checks": {_label(r): {k: v["passed"] for k, v in r["checks"].items()} for r in runs},
            "runs": runs}


def _label(run: Mapping[str, Any]) -> str:
    items = {**run["template"], **run["shape"]}
    return ",".join(f"{k}={v}" for k, v in items.items())


def variants_to_check(slug: str) -> list[tuple[str, dict[str, Any], str, list]]:
    """(kernel, params, source, shapes): defaults on the full grid, tuned entries at their shape."""
    from .tuned_params import load_table
    out = [(k, dict(KERNELS[k].space.default), "default", grid(k)) for k in KERNELS]
    table = load_table(slug) or {}
    for entry in table.get("entries", ()):
        if entry["template"] == KERNELS[entry["kernel"]].template(SUITE_TEMPLATE):
            out.append((entry["kernel"], entry["params"], "tuned",
                        [(entry["template"], entry["shape"])]))
    return out


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_record(out_dir: Path, kernels: list[str] | None = None,
                 commit: str | None = None) -> dict[str, Any]:
    from tqdm import tqdm

    from .device import gpu_name, gpu_slug
    slug = gpu_slug()
    todo = [v for v in variants_to_check(slug) if not kernels or v[0] in kernels]
    started = time.perf_counter()
    variants = []
    for kernel, params, source, shapes in tqdm(todo, desc="validate", unit="variant"):
        variants.append(variant_record(kernel, params, source, shapes))
    record = {"gpu": gpu_name(), "gpu_slug": slug,
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "commit": commit or git_commit(), "sources_hash": sources_hash(),
              "seconds": round(time.perf_counter() - started, 1),
              "summary": {"variants": len(variants),
                          "passed": sum(v["passed"] for v in variants),
                          "runs": sum(len(v["runs"]) for v in variants)},
              "variants": variants}
    path = out_dir / slug / "validation.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=float) + "\n")
    return record


def _run(args: argparse.Namespace) -> int:
    record = write_record(Path(args.out), args.kernels, args.commit)
    for v in record["variants"]:
        status = "PASS" if v["passed"] else "FAIL"
        err = f"{v['max_rel_err']:.2e}" if v["max_rel_err"] is not None else "-"
        print(f"{status} {v['kernel']:<22} {v['source']:<8} max_rel_err={err} {v['params']}")
        for run in v["runs"]:
            for failure in run["failures"]:
                print(f"     {_label(run)}: {failure}")
    s = record["summary"]
    print(f"{s['passed']}/{s['variants']} variants passed over {s['runs']} shape runs; "
          f"record in {Path(args.out) / record['gpu_slug'] / 'validation.json'}")
    return 0 if s["passed"] == s["variants"] else 1


def register(sub: Any) -> None:
    p = sub.add_parser("validate", help="GPU: check every default and tuned variant, write "
                                        "reports/<gpu>/validation.json")
    p.add_argument("--out", default="reports", help="reports folder (default: reports)")
    p.add_argument("--kernels", nargs="*", choices=sorted(KERNELS), help="only these kernels")
    p.add_argument("--commit", help="commit to record (default: git rev-parse, else 'unknown')")
    p.set_defaults(func=_run)
