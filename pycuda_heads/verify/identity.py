"""Proof that a restructuring of a family's sources left its compiled code alone, and the carrying
of its tuned entries over to the new source hash: the ``pycuda-heads identity`` and
``pycuda-heads restamp`` commands.

``identity FAMILY --base REV`` renders each variant of the family twice, from git revision REV
(a fresh process importing that revision's package) and from this checkout, compiles both with
the library's own nvcc options to PTX for compute_90 and a cubin for sm_90, and compares what
the entries the variant launches (``Op.entries``: two under FrdHead's WGMMA 1) are made of
(``entry_code``: the module's other entries, which its launches never run, left out) in the
PTX with its comment lines dropped and in the cubin, and the host side (shared-memory bytes and
whether the launch restrictions hold) at a few shapes.
The whole module's PTX and cubin are compared too, for the record. Digests are cached; a variant
whose two sides differ is compiled again on both sides, past the cache, before it counts. The
variants are every tuned entry of the family shipped in the tables, the space defaults at every
suite template and a seeded sample of other space points, each layout among them. The proof is
a JSON file.

``restamp FAMILY --proof FILE`` then rewrites the ``source_hash`` of the family's shipped tuned
entries from the proof's base hash to the installed one, and nothing else; it refuses unless the
proof is complete (every such entry compared), all equal, and made of the installed sources.
With ``--partial`` a proof that is not all equal carries the entries whose own variants compile
identically and leaves the others at the base hash (the runtime ignores them until they are
tuned again): an edit to one layout re-tunes that layout's entries only.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Mapping

from .. import records
from ..catalog import SUITE_TEMPLATE, catalog
from ..core.compile import NVCC_OPTIONS, cache_dir, variant_arch
from ..core.op import op_source_hash
from ..core.tuned import table_dir
from .entry_code import VERSION as ENTRY_CODE_VERSION
from .entry_code import entry_cubin_digest, entry_ptx, ptx_entries
from .static_check import NvccUnavailableError, nvcc_version

ARCH = "sm_90"
# K values at which the host side (shared bytes, launch restrictions) is compared.
HOST_KEYS = (1, 8, 64, 257, 4096)
# Run in a fresh interpreter with one tree's package first on the path: the rendered source,
# shared bytes, launch validity and family source hash of each variant read from stdin.
_RENDER = r"""
import json, sys
from pycuda_heads.catalog import catalog
from pycuda_heads.core.op import op_source_hash
from pycuda_heads.core.source import render
cat, out = catalog(), []
for v in json.load(sys.stdin):
    if v["kernel"] not in cat:  # a kernel this tree has not got
        out.append(None)
        continue
    spec = cat[v["kernel"]]
    env = {**v["template"]}
    # knobs, and knob values, this tree has not got are dropped (the caller sets them aside)
    known = {k: x for k, x in v["params"].items()
             if k in spec.space.params and x in spec.space.params[k]}
    params = spec.space.complete(known, env)  # knobs this tree has and the entry lacks
    host, shared = {}, spec.space.shared_bytes  # None: no dynamic shared memory in the family
    for label, shape in v["shapes"].items():
        names = {**env, **shape}
        host[label] = {"shared_bytes": shared(params, names) if shared else 0,
                       "runs": spec.space.violated(params, env, shape) is None}
    out.append({"source": render(spec.family, {**spec.template(env), **params},
                                 spec.source_dir),
                "host": host, "source_hash": op_source_hash(spec.op),
                "dropped": sorted(set(v["params"]) - set(known))})
json.dump(out, sys.stdout)
"""


class ProofError(ValueError):
    """A proof that cannot carry tuned entries over (incomplete, unequal or of other sources)."""


def variant_key(v: Mapping[str, Any]) -> str:
    """A variant as proofs, tables and validation records name it: kernel, template, params."""
    return json.dumps([v["kernel"], v.get("template"), v["params"]], sort_keys=True)


def check_installed(proof: Mapping[str, Any], installed: str) -> None:
    """ProofError unless ``proof`` was made of the sources whose hash is ``installed``."""
    head = (proof.get("head") or {}).get("source_hash")
    if head != installed:
        raise ProofError(f"the proof is of sources {head}, the installed ones are {installed}: "
                         "prove them again")


def _repo_root() -> Path:
    out = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "rev-parse",
                          "--show-toplevel"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def _revision(root: Path, rev: str) -> str:
    out = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise ValueError(f"--base {rev}: not a commit of {root}")
    return out.stdout.strip()


def _render_in(tree: Path, variants: list[dict[str, Any]]) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-c", _RENDER], input=json.dumps(variants), env=env,
                          cwd=tree, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"rendering in {tree} failed:\n{proc.stderr.strip()}")
    return json.loads(proc.stdout)


def render_at(rev: str | None, variants: list[dict[str, Any]],
              root: Path | None = None) -> list[dict[str, Any]]:
    """Each variant rendered by git revision ``rev`` (None: the working tree) in a fresh
    process: ``{"source", "host", "source_hash"}``."""
    root = root or _repo_root()
    if rev is None:
        return _render_in(root, variants)
    with tempfile.TemporaryDirectory(prefix="pycuda-heads-base-") as tmp:
        archive = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", rev],
                                 capture_output=True, check=True).stdout
        tar_path = Path(tmp) / "tree.tar"
        tar_path.write_bytes(archive)
        with tarfile.open(tar_path) as tar:
            tar.extractall(Path(tmp) / "tree", filter="data")
        return _render_in(Path(tmp) / "tree", variants)


_COMMENT = re.compile(r"^\s*//.*\n", re.M)


def strip_ptx(ptx: str) -> str:
    """PTX without its comment lines (compiler build banners) and ``.file`` lines."""
    return "".join(line for line in _COMMENT.sub("", ptx).splitlines(keepends=True)
                   if not line.lstrip().startswith(".file"))


def compile_digests(source: str, fresh: bool = False, arch: str = ARCH) -> dict[str, str]:
    """sha256 of the stripped PTX and of the cubin of ``source`` for ``arch`` (sm_90, or the
    variant's own: ``variant_arch``), compiled as the library compiles, and of each entry's own
    part of both (``entries``); cached on disk by source, options, arch and nvcc version
    (``fresh``: compiled again, the cache overwritten)."""
    key = hashlib.sha256("\0".join((source, *NVCC_OPTIONS, arch, nvcc_version(),
                                    f"entries {ENTRY_CODE_VERSION}")).encode()).hexdigest()[:24]
    cached = cache_dir("identity") / f"{key}.json"
    if cached.is_file() and not fresh:
        return json.loads(cached.read_text())
    with tempfile.TemporaryDirectory(prefix="pycuda-heads-") as tmp:
        cu, ptx, cubin = (Path(tmp) / n for n in ("v.cu", "v.ptx", "v.cubin"))
        cu.write_text(source)
        for cmd in (["nvcc", *NVCC_OPTIONS, f"-arch={arch.replace('sm_', 'compute_')}",
                     "--ptx", "-o", str(ptx), str(cu)],
                    ["ptxas", f"-arch={arch}", "-o", str(cubin), str(ptx)]):
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"{cmd[0]} failed:\n{proc.stderr.strip()}")
        text, code = strip_ptx(ptx.read_text()), cubin.read_bytes()
        names = ptx_entries(text)
        out = {"ptx": hashlib.sha256(text.encode()).hexdigest(),
               "cubin": hashlib.sha256(code).hexdigest(),
               "entries": {e: {"ptx": hashlib.sha256(entry_ptx(text, e).encode()).hexdigest(),
                               "cubin": entry_cubin_digest(code, e, names)} for e in names}}
    records.write_json(cached, out)
    return out


def shipped_entries(family: str, tables: Iterable[Path] | None = None) -> list[dict[str, Any]]:
    """The family's tuned entries in the shipped tables (each with its table's slug)."""
    out = []
    for path in sorted(tables if tables is not None else table_dir().glob("*.json")):
        for entry in json.loads(path.read_text()).get("entries", ()):
            if entry["kernel"].partition(".")[0] == family:
                out.append({**entry, "table": path.stem})
    return out


def _shapes(shape: Mapping[str, int] | None) -> dict[str, dict[str, int]]:
    out = {f"B=2,K={k}": {"B": 2, "K": k} for k in HOST_KEYS}
    if shape:
        out[records.dims_label(shape)] = {k: int(v) for k, v in shape.items()}
    return out


def variants(family: str, sample: int, seed: int = 0) -> list[dict[str, Any]]:
    """Shipped tuned entries, defaults at every suite template, then ``sample`` other space
    points per kernel (seeded; the same number of each layout where the space has one)."""
    specs = [s for s in catalog() if s.family == family]
    if not specs:
        raise ValueError(f"unknown kernel family {family!r}")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()

    def add(kernel: str, template: Mapping[str, int], params: Mapping[str, Any],
            shape: Mapping[str, int] | None, origin: str) -> None:
        key = json.dumps([kernel, template, params], sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append({"kernel": kernel, "template": dict(template), "params": dict(params),
                        "shapes": _shapes(shape), "origin": origin})

    for e in shipped_entries(family):
        add(e["kernel"], e["template"], e["params"], e["shape"], f"tuned {e['table']}")
    rng = random.Random(seed)
    for spec in specs:
        templates = {json.dumps(t, sort_keys=True): t for t, _ in
                     spec.suite_points(SUITE_TEMPLATE)}
        for t in templates.values():
            add(spec.id, t, spec.space.default, None, "default")
        points = [(t, p) for t in templates.values() for p in spec.space.points(t)]
        layouts: dict[Any, list] = {}
        for t, p in points:
            layouts.setdefault(p.get("LAYOUT"), []).append((t, p))
        for group in layouts.values():
            group = [(t, p) for t, p in group  # points not already listed
                     if json.dumps([spec.id, t, p], sort_keys=True) not in seen]
            for t, p in rng.sample(group, min(len(group), -(-sample // len(layouts)))):
                add(spec.id, t, p, None, "sample")
    return out


def prove(family: str, base: str, sample: int = 16, jobs: int = 2,
          root: Path | None = None) -> dict[str, Any]:
    """The identity proof of ``family`` between revision ``base`` and the working tree."""
    root = root or _repo_root()
    revision = _revision(root, base)
    todo = variants(family, sample)
    before, after = render_at(revision, todo, root), render_at(None, todo, root)
    # a point of a kernel the base has not got, or that sets a knob the base has not got (or
    # to a value it has not got) away from its default, is a new kernel, with nothing to be
    # identical to
    cat = catalog()
    default = {s.id: s.space.default for s in cat if s.family == family}
    kept = [i for i, v in enumerate(todo) if before[i] is not None
            and all(v["params"][k] == default[v["kernel"]][k] for k in before[i]["dropped"])]
    new_points = len(todo) - len(kept)
    todo, before, after = ([seq[i] for i in kept] for seq in (todo, before, after))
    sources = [r["source"] for r in (*before, *after)]
    archs = [variant_arch(v["params"]) or ARCH for v in todo] * 2
    own = [cat[v["kernel"]].entries(v["params"]) for v in todo]

    def mine(d: Mapping[str, Any], i: int) -> Any:
        """The digests in ``d`` of every entry variant ``i`` launches (None where one is
        missing)."""
        got = [d["entries"].get(e) for e in own[i]]
        return None if None in got else got

    with ThreadPoolExecutor(jobs) as pool:
        digests = list(pool.map(lambda i: compile_digests(sources[i], arch=archs[i]),
                                range(len(sources))))
        # A difference is confirmed by compiling both sides again: a cached digest once held
        # a compile that no later one reproduced, and a false difference would refuse a restamp
        differ = [i for i in range(len(todo))
                  if mine(digests[i], i) != mine(digests[len(todo) + i], i)]
        again = list(pool.map(lambda i: compile_digests(sources[i], fresh=True, arch=archs[i]),
                              [j for i in differ for j in (i, len(todo) + i)]))
    for n, i in enumerate(differ):
        digests[i], digests[len(todo) + i] = again[2 * n], again[2 * n + 1]
    rows = []
    for i, v in enumerate(todo):
        old, new = digests[i], digests[len(todo) + i]
        host_equal = before[i]["host"] == after[i]["host"]
        entry_old, entry_new = mine(old, i), mine(new, i)
        entry_equal = entry_old is not None and entry_old == entry_new
        rows.append({**{k: v[k] for k in ("kernel", "template", "params", "origin")},
                     "base": {**old, "host": before[i]["host"]},
                     "head": {**new, "host": after[i]["host"]},
                     "ptx_equal": old["ptx"] == new["ptx"],
                     "cubin_equal": old["cubin"] == new["cubin"], "entries": list(own[i]),
                     "entry_equal": entry_equal, "host_equal": host_equal,
                     "equal": entry_equal and host_equal})
    state = records.git_state(root)
    return {"family": family,
            "base": {"revision": revision, "source_hash": before[0]["source_hash"]},
            "head": {"revision": state["commit"], "dirty": state["dirty"],
                     "source_hash": after[0]["source_hash"]},
            "nvcc": nvcc_version(), "options": list(NVCC_OPTIONS), "arch": ARCH,
            "compared": len(rows), "shipped": sum(r["origin"].startswith("tuned") for r in rows),
            "new_at_head": new_points,
            "all_equal": all(r["equal"] for r in rows), "variants": rows}


def restamp(family: str, proof: Mapping[str, Any], tables: Iterable[Path] | None = None,
            installed: str | None = None, partial: bool = False) -> dict[str, int]:
    """Rewrite the ``source_hash`` of ``family``'s tuned entries proven unchanged; per table
    the number rewritten. Raises ``ProofError`` (and writes nothing) unless the proof is of
    this family, all equal (with ``partial``: any variant equal), made of the installed
    sources, and covers every entry of the base hash; with ``partial`` the entries whose
    variants differ keep the base hash."""
    spec = next((s for s in catalog() if s.family == family), None)
    if spec is None:
        raise ProofError(f"unknown kernel family {family!r}")
    installed = installed or op_source_hash(spec.op)
    if proof.get("family") != family:
        raise ProofError(f"the proof is of family {proof.get('family')!r}, not {family!r}")
    rows = proof.get("variants") or []
    unequal = [r for r in rows if not r.get("equal")]
    if not rows or (not partial and (unequal or not proof.get("all_equal"))) \
            or len(unequal) == len(rows):
        raise ProofError(f"the proof is not all equal: {len(unequal)} of {len(rows)} variants "
                         "compile differently" + "".join(
                             f"\n  {r['kernel']} {r['template']} {r['params']}" for r in unequal))
    check_installed(proof, installed)
    old, new = proof["base"]["source_hash"], proof["head"]["source_hash"]
    proven = {variant_key(r) for r in rows}
    equal = {variant_key(r) for r in rows if r.get("equal")}
    paths = sorted(tables if tables is not None else table_dir().glob("*.json"))
    changed: dict[Path, dict[str, Any]] = {}
    counts: dict[str, int] = {}
    for path in paths:
        table = json.loads(path.read_text())
        mine = [e for e in table.get("entries", ())
                if e["kernel"].partition(".")[0] == family and e.get("source_hash") == old]
        missing = [e for e in mine if variant_key(e) not in proven]
        if missing:
            raise ProofError(f"{path.name}: {len(missing)} {family} entries are not in the "
                             "proof" + "".join(f"\n  {e['kernel']} {e['shape']} {e['params']}"
                                               for e in missing))
        mine = [e for e in mine if variant_key(e) in equal]
        for e in mine:
            e["source_hash"] = new
        if mine:
            changed[path] = table
        counts[path.stem] = len(mine)
    for path, table in changed.items():
        records.write_json(path, table)
    return counts


def _identity_cli(args: argparse.Namespace) -> int:
    try:
        nvcc_version()
        proof = prove(args.family, args.base, args.sample, args.jobs)
    except (ValueError, NvccUnavailableError) as exc:
        print(f"pycuda-heads identity: {exc}", file=sys.stderr)
        return 2
    records.write_json(args.proof, proof)
    bad = [r for r in proof["variants"] if not r["equal"]]
    for r in bad:
        print(f"DIFFERS {r['kernel']} {r['template']} {r['params']} "
              f"entry_equal={r['entry_equal']} host_equal={r['host_equal']} (the whole module: "
              f"ptx_equal={r['ptx_equal']} cubin_equal={r['cubin_equal']})")
    print(f"{proof['compared'] - len(bad)}/{proof['compared']} {args.family} variants compile "
          f"their own entries identically ({proof['shipped']} shipped tuned); proof in "
          f"{args.proof}")
    return 1 if bad else 0


def _restamp_cli(args: argparse.Namespace) -> int:
    try:
        proof = json.loads(Path(args.proof).read_text())
        counts = restamp(args.family, proof, partial=args.partial)
    except (ProofError, OSError, json.JSONDecodeError) as exc:
        print(f"pycuda-heads restamp: refused: {exc}", file=sys.stderr)
        return 1
    for table, n in counts.items():
        print(f"{table}: {n} {args.family} entries carried over to the installed source hash")
    for r in proof["variants"]:
        if not r["equal"] and r.get("origin", "").startswith("tuned"):
            print(f"left for a re-tune: {r['kernel']} {r['template']} {r['params']}")
    return 0


def register(sub: Any) -> None:
    families = sorted(catalog().families())
    p = sub.add_parser("identity", help="prove a family's variants compile as at a revision")
    p.add_argument("family", choices=families, help="kernel family, e.g. pool")
    p.add_argument("--base", required=True, help="git revision to compare with")
    p.add_argument("--proof", required=True, type=Path, help="proof JSON file to write")
    p.add_argument("--sample", type=records.int_at_least(0), default=16,
                   help="other space points per kernel (besides shipped entries and defaults)")
    p.add_argument("--jobs", type=records.int_at_least(1), default=2, help="parallel compiles")
    p.set_defaults(func=_identity_cli)
    p = sub.add_parser("restamp", help="carry a family's tuned entries over to the installed "
                                       "source hash, given an all-equal identity proof")
    p.add_argument("family", choices=families, help="kernel family, e.g. pool")
    p.add_argument("--proof", required=True, type=Path, help="proof JSON of `identity`")
    p.add_argument("--partial", action="store_true",
                   help="carry the entries whose variants compile identically, leave the others "
                        "for a re-tune")
    p.set_defaults(func=_restamp_cli)
