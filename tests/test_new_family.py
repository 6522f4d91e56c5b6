"""CPU: a kernel family is its own files. A toy family ``scale`` (y = 2 x and its backward) goes
into a temporary copy of the package as two files, ``cu/scale.cu`` and ``ops/scale.py`` (its
float64 reference included): the catalog, the static check and the tuner take it in; the
record check flags that family alone until its own validation run is merged; and editing one
family's ``.cu`` stales that family's record and tuned entries only."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCALE_CU = """\
// Toy family: y = 2 x; grad_x = 2 grad_y. Each entry has a knob of its own.
#include "heads_common.cuh"

#ifdef ITEMS
extern "C" __global__ void __launch_bounds__(BLOCK)
scale_forward(const float* __restrict__ x, float* __restrict__ y, const int n)
{
    for (int i = (blockIdx.x * BLOCK + threadIdx.x) * ITEMS, e = 0; e < ITEMS; ++e)
        if (i + e < n) y[i + e] = 2.f * x[i + e];
}
#endif

#ifdef ROWS
extern "C" __global__ void __launch_bounds__(BLOCK)
scale_backward(const float* __restrict__ grad_y, float* __restrict__ grad_x, const int n)
{
    for (int i = blockIdx.x * BLOCK * ROWS + threadIdx.x, r = 0; r < ROWS; ++r, i += BLOCK)
        if (i < n) grad_x[i] = 2.f * grad_y[i];
}
#endif
"""

SCALE_PY = '''\
"""Toy family: y = 2 x (cu/scale.cu)."""
from typing import Any, Mapping

import numpy as np

from ..core.arrays import Inputs, empty
from ..core.op import Op
from ..core.space import KernelSpace, by_role
from ..core.spec import KernelSpec, Tensor

FORWARD_SPACE = KernelSpace(kernel="scale.forward", params={"BLOCK": (64, 128), "ITEMS": (1, 2)},
                            default={"BLOCK": 128, "ITEMS": 1})
BACKWARD_SPACE = KernelSpace(kernel="scale.backward", params={"BLOCK": (64, 128), "ROWS": (1, 4)},
                             default={"BLOCK": 128, "ROWS": 1})
FORWARD_INPUTS, BACKWARD_INPUTS = Inputs(x=("N",)), Inputs(grad_y=("N",))


class Scale(Op):
    FAMILY = "scale"
    SPACES = by_role(FORWARD_SPACE, BACKWARD_SPACE)

    def __init__(self, launch: Mapping[str, Mapping[str, Any]] | None = None):
        super().__init__({}, launch)

    def forward(self, x: Any, *, stream: Any = None) -> Any:
        (x,), dims = FORWARD_INPUTS.adapt(self._checked, {}, x)
        n = dims["N"]
        plan = self.plan("forward", {"N": n}, lambda p: (
            (-(-n // (p["BLOCK"] * p["ITEMS"])), 1, 1), (p["BLOCK"], 1, 1), 0))
        y = empty((n,))
        plan.kernel(plan.grid, plan.block, x=x.gpudata, y=y.gpudata, n=n, stream=stream)
        return y

    def backward(self, grad_y: Any, *, stream: Any = None) -> Any:
        (grad_y,), dims = BACKWARD_INPUTS.adapt(self._checked, {}, grad_y)
        n = dims["N"]
        plan = self.plan("backward", {"N": n}, lambda p: (
            (-(-n // (p["BLOCK"] * p["ROWS"])), 1, 1), (p["BLOCK"], 1, 1), 0))
        grad_x = empty((n,))
        plan.kernel(plan.grid, plan.block, grad_y=grad_y.gpudata, grad_x=grad_x.gpudata, n=n,
                    stream=stream)
        return grad_x


def twice(x: Any, dtype: type = np.float64) -> np.ndarray:
    """The float64 reference of both kernels."""
    return 2 * np.asarray(x, dtype)


TENSORS = {name: Tensor(("N",)) for name in ("x", "y", "grad_y", "grad_x")}
_COMMON = dict(op=Scale, template_keys=(), tensors=TENSORS, reference=twice,
               suite=({"N": 1000},), grid=(({}, {"N": 1}),))
SPECS = (KernelSpec(method="forward", space=FORWARD_SPACE, reads=("x",), writes=("y",), **_COMMON),
         KernelSpec(method="backward", space=BACKWARD_SPACE, reads=("grad_y",),
                    writes=("grad_x",), **_COMMON))
'''

# Run in the copy, in a fresh interpreter: hashes of every family, the catalog's view of the
# toy family, and what the record check says of a record validated at the copy's sources.
PROBE = """
import json, sys
from pycuda_heads.catalog import catalog
from pycuda_heads.core.op import op_source_hash
from pycuda_heads.catalog import SUITE_TEMPLATE
from pycuda_heads.core.source import render, variant_hash
from pycuda_heads.verify.validation import merge_record, stale_families

cat = catalog()
record_path, families = sys.argv[1], sys.argv[2:]
try:
    record = json.load(open(record_path))
except FileNotFoundError:
    record = None
variants = [{"kernel": s.id, "params": dict(s.space.default), "passed": True, "runs": [{}],
             "template": s.template(SUITE_TEMPLATE), "source_hash": op_source_hash(s.op),
             "variant_hash": variant_hash(render(s.family, {**s.template(SUITE_TEMPLATE),
                                                            **s.space.default}, s.source_dir))}
            for s in cat if s.family in families]
run = {"gpu": "G", "gpu_slug": "g", "date": "d", "commit": "c", "seconds": 0, "sanitized": False}
if families:  # a GPU validation run of these families alone, merged into the record
    record = merge_record(record, variants, run, cat)
    json.dump(record, open(record_path, "w"), sort_keys=True)
print(json.dumps({
    "hashes": {f: op_source_hash(specs[0].op) for f, specs in cat.families().items()},
    "stale": stale_families(record or {}, cat),
    "kernels": sorted(cat.specs),
    "tasks": [[s.id, shape] for s, _, shape in cat.tasks() if s.family == "scale"],
    "bench": [[c.pass_, c.shape] for c in cat.bench_cases() if c.op == "scale"],
    "other_variants": [json.dumps(v, sort_keys=True) for v in (record or {}).get("variants", ())
                       if not v["kernel"].startswith("scale.")],
}))
"""


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package and its sources, copied as a new family's author has them."""
    root = tmp_path_factory.mktemp("checkout")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "pycuda_heads", root / "pycuda_heads", ignore=ignore)
    shutil.copytree(ROOT / "cu", root / "cu", ignore=ignore)
    return root


def probe(root: Path, *validate: str) -> dict:
    """The PROBE's findings in ``root``; ``validate`` names the families a simulated GPU
    validation run covers (merged into ``root/validation.json``)."""
    proc = subprocess.run([sys.executable, "-c", PROBE, str(root / "validation.json"), *validate],
                          cwd=root, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def edit(path: Path, extra: str) -> None:
    path.write_text(path.read_text() + extra)


def test_a_new_family_is_its_own_files_and_stales_nothing_else(copy: Path) -> None:
    before = probe(copy, *probe(copy)["hashes"])  # every family validated at these sources
    assert before["stale"] == {}

    (copy / "cu" / "scale.cu").write_text(SCALE_CU)
    (copy / "pycuda_heads" / "ops" / "scale.py").write_text(SCALE_PY)
    added = probe(copy)
    assert {"scale.forward", "scale.backward"} <= set(added["kernels"])
    assert added["tasks"] == [["scale.forward", {"N": 1000}], ["scale.backward", {"N": 1000}]]
    assert added["bench"] == [["forward", {"N": 1000}], ["backward", {"N": 1000}],
                              ["fwd+bwd", {"N": 1000}]]
    assert {f: h for f, h in added["hashes"].items() if f != "scale"} == before["hashes"]
    # CI fails for the new family alone, until its own validation run is recorded
    assert list(added["stale"]) == ["scale"] and "default variant" in added["stale"]["scale"]
    validated = probe(copy, "scale")
    assert validated["stale"] == {}
    assert validated["other_variants"] == before["other_variants"]  # the others, byte for byte


def test_editing_one_family_stales_that_family_only(copy: Path) -> None:
    before = probe(copy, *probe(copy)["hashes"])
    edit(copy / "cu" / "gate.cu", "\n// an edit\n")
    after = probe(copy)
    changed = {f for f in before["hashes"] if before["hashes"][f] != after["hashes"][f]}
    assert changed == {"gate"} and list(after["stale"]) == ["gate"]
    # the reduce family's sum serves every backward: its edit stales the families calling it
    before = probe(copy, "gate")
    edit(copy / "cu" / "reduce.cu", "\n// an edit\n")
    after = probe(copy)
    callers = {f for f in before["hashes"] if before["hashes"][f] != after["hashes"][f]}
    texts = {p.stem: p.read_text() for p in (copy / "pycuda_heads" / "ops").glob("*.py")}
    users = {f for f, text in texts.items() if "reducer" in text or f == "reduce"}
    while True:  # and the families importing one of those (frdsmall reuses frdhead's specs)
        more = {f for f, text in texts.items() if any(f"from .{u} import" in text for u in users)}
        if more <= users:
            break
        users |= more
    assert callers == users and set(after["stale"]) == users and "frd" not in users


def test_a_tuned_entry_of_another_family_survives_an_edit(copy: Path) -> None:
    """The tuned table's entries carry their family's hash: an edit of gate.cu leaves pool's
    entries applicable."""
    table = json.loads((ROOT / "pycuda_heads" / "tuned" / "nvidia-h200.json").read_text())
    families = {e["kernel"].partition(".")[0] for e in table["entries"]}
    before = probe(copy)["hashes"]
    edit(copy / "cu" / "gate.cu", "\n// another edit\n")
    after = probe(copy)["hashes"]
    assert {f for f in families if before[f] != after[f]} <= {"gate"}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_static_check_compiles_a_new_family_and_names_the_ifdef_rule(copy: Path) -> None:
    (copy / "cu" / "scale.cu").write_text(SCALE_CU)
    (copy / "pycuda_heads" / "ops" / "scale.py").write_text(SCALE_PY)
    check = textwrap.dedent("""
        from pycuda_heads.catalog import catalog
        from pycuda_heads.verify.static_check import jobs, run_checks
        todo = [j for j in jobs(catalog(), True, ("sm_90",)) if j[0].family == "scale"]
        print(len(todo), all(r.ok for r in run_checks(todo)))
    """)
    env = {**os.environ, "PYTHONPATH": str(copy)}
    run = lambda: subprocess.run([sys.executable, "-c", check], cwd=copy, env=env,  # noqa: E731
                                 capture_output=True, text=True)
    ok = run()
    assert ok.returncode == 0 and ok.stdout.split() == ["8", "True"], ok.stderr
    # without its #ifdef, the backward entry breaks every forward variant, with a clear message
    unguarded = SCALE_CU.replace("#ifdef ROWS\n", "")
    end = unguarded.rindex("#endif\n")
    (copy / "cu" / "scale.cu").write_text(unguarded[:end] + unguarded[end + len("#endif\n"):])
    broken = run()
    assert broken.returncode != 0
    assert "uses ROWS, which this variant does not define" in broken.stderr
    assert "#ifdef ROWS" in broken.stderr
