"""The GPU validation record ``reports/<gpu-slug>/validation.json`` and ``pycuda-heads validate``.

Each variant (the default launch parameters of every kernel, and every entry of the shipped tuned
table for this GPU) runs ``checks.validate_case`` over a grid of shapes; the record keeps, per
variant, what was checked, the errors, pass/fail, the hash of its rendered source and its
family's ``source_hash`` (``op_source_hash``: the family's ``.cu`` with the header, its op module
and the ops it calls). A CPU test fails for the families whose sources changed without a new
record; ``--kernels`` re-validates some kernels (or whole families) and keeps the rest.

With ``--sanitize`` every variant also runs under each tool of NVIDIA's compute-sanitizer
(memcheck, racecheck, initcheck, synccheck) at a small shape, in a child process per tool
and variant (``python -m pycuda_heads.verify.validation KERNEL PARAMS``, several variants at
once); the findings, read from the tool's summary (racecheck counts every hazard it displays,
warnings included), go into the record, and a variant passes only with none. A variant whose
rendered source and sanitizer shape are those of a clean result in the previous record keeps
that result instead of running again. So does a variant that an identity proof (``pycuda-heads
identity``, ``--proof``) shows compiling to the same entry and launch as at the sources of its
clean result (the record says where it came from): the code it would run is the code that ran.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Mapping

from .. import records
from ..catalog import SUITE_TEMPLATE, Catalog, catalog
from ..core.op import op_source_hash
from ..core.source import render, variant_hash
from ..core.spec import KernelSpec
from ..progress import Steps
from .identity import ProofError, check_installed, variant_key

Shapes = list[tuple[dict[str, int], dict[str, int]]]


def variant_record(spec: KernelSpec, params: Mapping[str, Any], source: str,
                   shapes: Iterable[tuple[dict[str, int], dict[str, int]]],
                   template: Mapping[str, int]) -> dict[str, Any]:
    """The record of one variant: its runs over ``shapes``, and ``template`` (the template
    constants it is recorded at) with the hash of its source rendered there."""
    from .cases import Case
    from .checks import validate_case
    runs = []
    for run_template, shape in shapes:
        result = validate_case(Case(spec, shape, params, run_template))
        runs.append({"template": run_template, "shape": shape, **result})
    rel = [r["max_rel_err"] for r in runs if r["max_rel_err"] is not None]
    template = dict(template)
    return {"kernel": spec.id, "source": source, "template": template,
            "params": dict(params), "source_hash": op_source_hash(spec.op),
            "variant_hash": variant_hash(render(spec.family, {**template, **params},
                                                spec.source_dir)),
            "passed": all(r["passed"] for r in runs), "max_rel_err": max(rel) if rel else None,
            "checks": {_label(r): {k: v["passed"] for k, v in r["checks"].items()} for r in runs},
            "runs": runs}


def _label(run: Mapping[str, Any]) -> str:
    return records.dims_label({**run["template"], **run["shape"]})


def variants_to_check(cat: Catalog, table: Mapping[str, Any] | None
                      ) -> list[tuple[KernelSpec, dict[str, Any], str, Shapes, dict[str, int]]]:
    """(kernel, params, source, shapes, template): defaults on the full grid, recorded at the
    suite template, then the entries of the tuned ``table`` at their shape, recorded at the
    template they were tuned at (a wide model size for some). An entry tuned for other sources
    of its family is left out: the op never applies it, so it is no tuned variant."""
    out = []
    for s in cat:  # where the default cannot run, the op runs its nearest valid point
        by_params: dict[tuple, Shapes] = {}
        for template, shape in cat.grid(s.id):
            params = s.space.nearest(s.space.default, template, shape)
            by_params.setdefault(tuple(params.items()), []).append((template, shape))
        out += [(s, dict(p), "default" if dict(p) == s.space.default else "default (nearest "
                 "valid)", shapes, s.template(SUITE_TEMPLATE)) for p, shapes in by_params.items()]
    for entry in (table or {}).get("entries", ()):  # wide-model templates included
        if entry["kernel"] in cat and \
                entry.get("source_hash") == op_source_hash(cat[entry["kernel"]].op):
            spec = cat[entry["kernel"]]
            template = spec.template({**SUITE_TEMPLATE, **entry["template"]})
            out.append((spec, entry["params"], "tuned", [(template, entry["shape"])], template))
    return out


SANITIZER = "compute-sanitizer"
SANITIZER_TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
# Findings are the kernels' own. Failed driver calls are not counted: the library raises on
# every one it makes, and NVIDIA's cuda-bindings (programmatic dependent launch) probes driver
# entry points as it loads, some of which a driver refuses (34 cuGetProcAddress calls on 580).
SANITIZER_OPTIONS = ("--report-api-errors", "no")
_SUMMARY = re.compile(r"(?:ERROR SUMMARY: (\d+) error|RACECHECK SUMMARY: (\d+) hazard)")
#: variants under the sanitizer at once (each tool run is a process with its own context)
SANITIZER_JOBS = max(1, min(16, os.cpu_count() or 1))


def sanitizer_shape(shapes: Shapes) -> tuple[dict[str, int], dict[str, int]]:
    """The smallest shape with every axis at least 2 (so blocks hold several rows and warps
    share memory, where races live), else the smallest."""
    size = lambda ts: math.prod(ts[1].values())  # noqa: E731
    wide = [ts for ts in shapes if min(ts[1].values()) >= 2]
    return min(wide or shapes, key=size)


def sanitize(spec: KernelSpec, params: Mapping[str, Any], shapes: Shapes,
             tools: Iterable[str] = SANITIZER_TOOLS, timeout_s: float = 900) -> dict[str, Any]:
    """Findings of each compute-sanitizer tool on the variant at ``sanitizer_shape``:
    ``{tool: {"errors": N or None, "exit": status, "shape": ...}}``; ``errors`` is None when
    the run gave no summary (a crash or a timeout), which counts as a finding."""
    template, shape = sanitizer_shape(shapes)
    out: dict[str, Any] = {}
    for tool in tools:
        cmd = [SANITIZER, "--tool", tool, *SANITIZER_OPTIONS, "--error-exitcode", "86",
               sys.executable, "-m",
               __name__, spec.id, json.dumps({"params": dict(params), "template": template,
                                              "shape": shape})]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            text, status = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired:
            text, status = f"timed out after {timeout_s:.0f} s", None
        found = [int(a or b) for a, b in _SUMMARY.findall(text)]
        out[tool] = {"errors": found[-1] if found else None, "exit": status,
                     "template": template, "shape": shape,
                     "log": "" if found and found[-1] == 0 and status == 0 else text[-2000:]}
    return out


def findings(sanitizer: Mapping[str, Any]) -> int:
    """Errors over all tools; a run without a summary counts as one."""
    return sum(1 if r["errors"] is None else r["errors"] + (r["exit"] not in (0, 86))
               for r in sanitizer.values())


def _sanitize_child(kernel: str, spec_json: str) -> int:
    """Launch one variant once at one shape (the process compute-sanitizer watches)."""
    from ..core.device import cuda
    from .cases import Case
    given = json.loads(spec_json)
    Case(catalog()[kernel], given["shape"], given["params"], given["template"]).launch()
    cuda().Context.synchronize()
    return 0


def _sanitizer_key(v: Mapping[str, Any], template: Mapping[str, int],
                   shape: Mapping[str, int]) -> tuple[str, ...]:
    """A sanitizer result holds while the variant's source, its family's launch code and the
    shape it ran at are unchanged."""
    return (v["kernel"], v["variant_hash"], v.get("source_hash", ""),
            json.dumps([template, shape], sort_keys=True))


def check_proofs(proofs: Iterable[Mapping[str, Any]], cat: Catalog) -> list[Mapping[str, Any]]:
    """The identity proofs, each checked to be of a known family and made of its installed
    sources (ProofError otherwise)."""
    out = []
    for proof in proofs:
        specs = cat.families().get(proof.get("family", ""))
        if not specs:
            raise ProofError(f"the proof is of unknown family {proof.get('family')!r}")
        if not isinstance(proof.get("base"), dict) or not isinstance(proof.get("variants"), list):
            raise ProofError(f"the {proof['family']} proof has no base or variants")
        check_installed(proof, op_source_hash(specs[0].op))
        out.append(proof)
    return out


def _clean_sanitizer_runs(path: Path, proofs: Iterable[Mapping[str, Any]] = ()
                          ) -> dict[tuple[str, ...], tuple[dict[str, Any], dict[str, Any] | None]]:
    """Sanitizer results with 0 findings in the record at ``path``, by kernel, rendered-source
    hash and the template and shape they ran at, each with None; {} when there is no readable
    record. A variant that one of ``proofs`` shows unchanged (entry and launch) from the sources
    it was sanitized at is keyed at the installed sources as well, with where it came from."""
    try:
        old = records.read_json(path, "validation record")
    except (OSError, ValueError):
        return {}
    cat = catalog()
    proven = {variant_key(r): proof for proof in proofs for r in proof["variants"]
              if r.get("equal")}
    clean: dict[tuple[str, ...], tuple[dict[str, Any], dict[str, Any] | None]] = {}
    for v in old.get("variants", ()):
        runs = v.get("sanitizer")
        if not (runs and "variant_hash" in v and findings(runs) == 0):
            continue
        first = next(iter(runs.values()))
        at = (first["template"], first["shape"])
        clean[_sanitizer_key(v, *at)] = (runs, None)
        proof = proven.get(variant_key(v))
        if proof and v["kernel"] in cat and v.get("source_hash") == proof["base"]["source_hash"]:
            spec = cat[v["kernel"]]
            now = {**v, "source_hash": proof["head"]["source_hash"], "variant_hash": variant_hash(
                render(spec.family, {**v["template"], **v["params"]}, spec.source_dir))}
            family = old.get("families", {}).get(spec.family, {})
            clean.setdefault(_sanitizer_key(now, *at), (runs, {
                "commit": family.get("commit"), "source_hash": v["source_hash"],
                "proof": {"base": proof["base"]["revision"], "head": proof["head"]["revision"]}}))
    return clean


def selected(cat: Catalog, names: Iterable[str] | None) -> set[str]:
    """Kernel ids named by ``names``: kernel ids, or family names for all of a family's
    kernels; every kernel when ``names`` is empty."""
    families = cat.families()
    out: set[str] = set()
    for name in names or ():
        if name in families:
            out.update(s.id for s in families[name])
        elif name in cat:
            out.add(name)
        else:
            raise ValueError(f"unknown kernel or family {name!r}; expected one of "
                             f"{sorted(families)} or {sorted(cat.specs)}")
    return out or set(cat.specs)


def stale_families(record: Mapping[str, Any], cat: Catalog) -> dict[str, str]:
    """family -> what in ``record`` is out of date against the installed sources; a family is
    current when its default variants are recorded, every variant of it carries the family's
    ``op_source_hash`` and its rendered source is unchanged."""
    out = {}
    variants = record.get("variants", ())
    for family, specs in cat.families().items():
        now = op_source_hash(specs[0].op)
        ids = {s.id for s in specs}
        mine = [v for v in variants if v.get("kernel") in ids]
        have = {(v["kernel"], json.dumps(v.get("params"), sort_keys=True)) for v in mine}
        missing = [s.id for s in specs
                   if (s.id, json.dumps(dict(s.space.default), sort_keys=True)) not in have]
        if missing:
            out[family] = f"no record of the default variant of {missing}"
        elif any(v.get("source_hash") != now for v in mine) or \
                record.get("families", {}).get(family, {}).get("source_hash") != now:
            out[family] = f"its sources changed since it was validated (now {now})"
        else:
            for v in mine:
                spec = cat[v["kernel"]]
                rendered = render(spec.family, {**v["template"], **v["params"]}, spec.source_dir)
                if variant_hash(rendered) != v.get("variant_hash"):
                    out[family] = f"{v['kernel']} {v['params']}: its rendered source changed"
    return out


def merge_record(old: Mapping[str, Any] | None, variants: list[dict[str, Any]],
                 run: Mapping[str, Any], cat: Catalog) -> dict[str, Any]:
    """The record with ``variants`` (a run over some kernels) in place of the old record's
    variants of those kernels; other kernels keep theirs, so re-validating one family leaves
    every other family's entries as they were. ``run`` (gpu, date, commit, seconds, sanitizer)
    is kept per family the run touched."""
    done = {v["kernel"] for v in variants}
    kept = [v for v in (old or {}).get("variants", ())
            if v.get("kernel") in cat and v["kernel"] not in done]
    order = {k: i for i, k in enumerate(cat.specs)}
    merged = sorted(kept + variants, key=lambda v: order[v["kernel"]])  # stable: runs in order
    families = {f: e for f, e in (old or {}).get("families", {}).items()
                if f in cat.families()}
    for family in sorted({cat[k].family for k in done}):
        families[family] = {"source_hash": op_source_hash(cat.families()[family][0].op), **run}
    sanitized = [v for v in merged if "sanitizer" in v]
    return {"gpu": run["gpu"], "gpu_slug": run["gpu_slug"], "date": run["date"],
            "commit": run["commit"], "families": dict(sorted(families.items())),
            "summary": {"variants": len(merged), "passed": sum(v["passed"] for v in merged),
                        "runs": sum(len(v["runs"]) for v in merged),
                        "sanitized_variants": len(sanitized),
                        "sanitizer_tools": list(SANITIZER_TOOLS),
                        "sanitizer_options": list(SANITIZER_OPTIONS),
                        "sanitizer_findings": sum(findings(v["sanitizer"]) for v in sanitized)},
            "variants": merged}


def write_record(out_dir: Path, kernels: list[str] | None = None,
                 commit: str | None = None, sanitizer: bool = False,
                 proofs: Iterable[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """Validate the variants of ``kernels`` (kernel ids or families; all when None) and merge
    them into ``out_dir/<gpu>/validation.json``; with ``sanitizer``, identity ``proofs`` (as
    ``check_proofs`` returns them) carry clean results of variants they show unchanged."""
    from ..core.device import gpu_name, gpu_slug
    from ..core.tuned import load_table
    slug = gpu_slug()  # no GPU: the one-line GpuUnavailableError before anything else
    cat = catalog()
    wanted = selected(cat, kernels)
    todo = [v for v in variants_to_check(cat, load_table(slug)) if v[0].id in wanted]
    path = out_dir / slug / records.VALIDATION_JSON
    started = time.perf_counter()
    variants = []
    with Steps(len(todo), "validate", "variant") as steps:
        for spec, params, source, shapes, template in todo:
            variants.append(variant_record(spec, params, source, shapes, template))
            steps.step(f"{spec.id} {source}")
    if sanitizer:
        # a variant whose source and launch code are unchanged, or proven to compile as they
        # did, keeps its clean findings
        clean = _clean_sanitizer_runs(path, proofs)
        keys = [_sanitizer_key(v, *sanitizer_shape(t[3])) for t, v in zip(todo, variants)]
        fresh = [(i, t) for i, t in enumerate(todo) if keys[i] not in clean]
        found = []
        with ThreadPoolExecutor(SANITIZER_JOBS) as pool, \
                Steps(len(fresh), "sanitize", "variant") as steps:
            for (_, (spec, _, source, *_)), result in zip(
                    fresh, pool.map(lambda it: sanitize(it[1][0], it[1][1], it[1][3]), fresh)):
                found.append(result)
                steps.step(f"{spec.id} {source}")
        results = dict(zip((i for i, _ in fresh), found))
        for i, variant in enumerate(variants):
            if i in results:
                variant["sanitizer"] = results[i]
            else:
                variant["sanitizer"], carried = clean[keys[i]]
                if carried:
                    variant["sanitizer_carried"] = carried
            variant["passed"] &= findings(variant["sanitizer"]) == 0
    try:
        old = records.read_json(path, "validation record") if path.is_file() else None
    except ValueError:
        old = None  # unreadable: this run starts a new one
    run = {"gpu": gpu_name(), "gpu_slug": slug,
           "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "commit": commit or records.git_state()["describe"],
           "seconds": round(time.perf_counter() - started, 1), "sanitized": sanitizer}
    record = merge_record(old if old and old.get("gpu_slug") == slug else None, variants, run,
                          cat)
    records.write_json(path, record)
    return record


def _run(args: argparse.Namespace) -> int:
    started = time.time()
    if args.sanitize and shutil.which(SANITIZER) is None:
        print(f"pycuda-heads validate: --sanitize needs {SANITIZER} on the PATH (it comes with "
              "the CUDA toolkit)", file=sys.stderr)
        return 2
    # no GPU: cli.main reports it in one line on stderr, exit 2
    try:  # before the GPU is asked for: a proof of other sources is refused on any machine
        proofs = check_proofs([records.read_json(f, "identity proof") for f in args.proof or ()],
                              catalog())
    except (OSError, ValueError) as exc:  # ProofError is a ValueError, as is bad JSON
        print(f"pycuda-heads validate: --proof: {exc}", file=sys.stderr)
        return 2
    record = write_record(Path(args.out), args.kernels, args.commit, args.sanitize, proofs)
    wanted = selected(catalog(), args.kernels)
    ran = [v for v in record["variants"] if v["kernel"] in wanted]
    for v in ran:
        status = "PASS" if v["passed"] else "FAIL"
        err = f"{v['max_rel_err']:.2e}" if v["max_rel_err"] is not None else "-"
        print(f"{status} {v['kernel']:<22} {v['source']:<8} max_rel_err={err} {v['params']}")
        for run in v["runs"]:
            for failure in run["failures"]:
                print(f"     {_label(run)}: {failure}")
        for tool, r in v.get("sanitizer", {}).items():
            if r["errors"] != 0 or r["exit"] != 0:
                print(f"     {SANITIZER} {tool}: {r['errors']} errors, exit {r['exit']}")
    passed = sum(v["passed"] for v in ran)
    print(f"{passed}/{len(ran)} variants passed over {sum(len(v['runs']) for v in ran)} shape "
          f"runs; record in {Path(args.out) / record['gpu_slug'] / records.VALIDATION_JSON}")
    status = 0 if passed == len(ran) else 1
    records.log_phase(Path(args.out) / record["gpu_slug"], "validate", started, status,
                      "kernels " + ",".join(args.kernels) if args.kernels else "")
    return status


def register(sub: Any) -> None:
    p = sub.add_parser("validate", help="GPU: check every default and tuned variant, write "
                                        "reports/<gpu>/validation.json")
    p.add_argument("--out", default="reports", help="reports folder (default: reports)")
    p.add_argument("--kernels", type=records.name_list({*catalog().specs, *catalog().families()},
                                                       "kernels or families"),
                   help="only these kernels or families, e.g. pool,gate.forward; the record "
                        "keeps the others' entries")
    p.add_argument("--commit", help="commit to record (default: git describe, else 'unknown')")
    p.add_argument("--sanitize", action="store_true",
                   help=f"also run every variant under {SANITIZER} ({', '.join(SANITIZER_TOOLS)})"
                        " at a small shape; 0 findings required")
    p.add_argument("--proof", action="append", metavar="FILE",
                   help="an identity proof (pycuda-heads identity) of the installed sources: "
                        "variants it shows compiling as they did keep their clean sanitizer "
                        "results; repeat for several families")
    p.set_defaults(func=_run)


if __name__ == "__main__":
    sys.exit(_sanitize_child(*sys.argv[1:]))
