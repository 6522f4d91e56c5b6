"""The GPU validation record ``reports/<gpu-slug>/validation.json`` and ``pycuda-heads validate``.

Each variant (the default launch parameters of every kernel, and every entry of the shipped tuned
table for this GPU) runs ``checks.validate_case`` over a grid of shapes; the record keeps, per
variant, what was checked, the errors, pass/fail and the hash of its rendered source, and the
hash of all kernel sources. A CPU test fails when the sources change without a new record.
"""
from __future__ import annotations

import argparse
import datetime as dt
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from .. import records
from ..catalog import SUITE_TEMPLATE, Catalog, catalog
from ..core.source import render, sources_hash, variant_hash
from ..core.spec import KernelSpec

Shapes = list[tuple[dict[str, int], dict[str, int]]]


def variant_record(spec: KernelSpec, params: Mapping[str, Any], source: str,
                   shapes: Iterable[tuple[dict[str, int], dict[str, int]]]) -> dict[str, Any]:
    from .cases import Case
    from .checks import validate_case
    runs = []
    for template, shape in shapes:
        result = validate_case(Case(spec, shape, params, template))
        runs.append({"template": template, "shape": shape, **result})
    rel = [r["max_rel_err"] for r in runs if r["max_rel_err"] is not None]
    suite_template = spec.template(SUITE_TEMPLATE)
    return {"kernel": spec.id, "source": source, "template": suite_template,
            "params": dict(params),
            "variant_hash": variant_hash(render(spec.family, {**suite_template, **params},
                                                spec.source_dir)),
            "passed": all(r["passed"] for r in runs), "max_rel_err": max(rel) if rel else None,
            "checks": {_label(r): {k: v["passed"] for k, v in r["checks"].items()} for r in runs},
            "runs": runs}


def _label(run: Mapping[str, Any]) -> str:
    return records.dims_label({**run["template"], **run["shape"]})


def variants_to_check(cat: Catalog, table: Mapping[str, Any] | None
                      ) -> list[tuple[KernelSpec, dict[str, Any], str, Shapes]]:
    """(kernel, params, source, shapes): defaults on the full grid, then the entries of the
    tuned ``table`` at their shape."""
    out = []
    for s in cat:  # at a template the default cannot run, the op runs its nearest valid point
        by_params: dict[tuple, Shapes] = {}
        for template, shape in cat.grid(s.id):
            params = s.space.nearest(s.space.default, template)
            by_params.setdefault(tuple(params.items()), []).append((template, shape))
        out += [(s, dict(p), "default" if dict(p) == s.space.default else "default (nearest "
                 "valid)", shapes) for p, shapes in by_params.items()]
    for entry in (table or {}).get("entries", ()):
        if entry["kernel"] not in cat:
            continue
        spec = cat[entry["kernel"]]
        if entry["template"] == spec.template(SUITE_TEMPLATE):
            out.append((spec, entry["params"], "tuned", [(entry["template"], entry["shape"])]))
    return out


def write_record(out_dir: Path, kernels: list[str] | None = None,
                 commit: str | None = None) -> dict[str, Any]:
    from tqdm import tqdm

    from ..core.device import gpu_name, gpu_slug
    from ..core.tuned import load_table
    slug = gpu_slug()
    todo = [v for v in variants_to_check(catalog(), load_table(slug))
            if not kernels or v[0].id in kernels]
    started = time.perf_counter()
    variants = []
    for spec, params, source, shapes in tqdm(todo, desc="validate", unit="variant"):
        variants.append(variant_record(spec, params, source, shapes))
    record = {"gpu": gpu_name(), "gpu_slug": slug,
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "commit": commit or records.git_state()["describe"],
              "sources_hash": sources_hash(),
              "seconds": round(time.perf_counter() - started, 1),
              "summary": {"variants": len(variants),
                          "passed": sum(v["passed"] for v in variants),
                          "runs": sum(len(v["runs"]) for v in variants)},
              "variants": variants}
    records.write_json(out_dir / slug / records.VALIDATION_JSON, record)
    return record


def _run(args: argparse.Namespace) -> int:
    from ..core.device import GpuUnavailableError
    started = time.time()
    try:
        record = write_record(Path(args.out), args.kernels, args.commit)
    except GpuUnavailableError as exc:
        print(f"pycuda-heads validate: {exc}")
        return 2
    for v in record["variants"]:
        status = "PASS" if v["passed"] else "FAIL"
        err = f"{v['max_rel_err']:.2e}" if v["max_rel_err"] is not None else "-"
        print(f"{status} {v['kernel']:<22} {v['source']:<8} max_rel_err={err} {v['params']}")
        for run in v["runs"]:
            for failure in run["failures"]:
                print(f"     {_label(run)}: {failure}")
    s = record["summary"]
    print(f"{s['passed']}/{s['variants']} variants passed over {s['runs']} shape runs; record in "
          f"{Path(args.out) / record['gpu_slug'] / records.VALIDATION_JSON}")
    status = 0 if s["passed"] == s["variants"] else 1
    records.log_phase(Path(args.out) / record["gpu_slug"], "validate", started, status)
    return status


def register(sub: Any) -> None:
    p = sub.add_parser("validate", help="GPU: check every default and tuned variant, write "
                                        "reports/<gpu>/validation.json")
    p.add_argument("--out", default="reports", help="reports folder (default: reports)")
    p.add_argument("--kernels", nargs="*", choices=sorted(catalog().specs),
                   help="only these kernels")
    p.add_argument("--commit", help="commit to record (default: git describe, else 'unknown')")
    p.set_defaults(func=_run)
