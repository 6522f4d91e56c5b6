"""The shipped tuned tables: every entry is found by the run-time lookup at its own shape, nearby
shapes pick the nearest entry, and on a GPU with a table the ops launch with its parameters."""
import json

import numpy as np
import pytest

from pycuda_heads.catalog import catalog
from pycuda_heads.core.op import op_source_hash
from pycuda_heads.core.tuned import TABLE_DIR, lookup

TABLES = sorted(TABLE_DIR.glob("*.json"))


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.stem)
def test_every_entry_is_what_the_lookup_returns(path):
    table = json.loads(path.read_text())
    assert table["entries"] and table["provenance"]["git_commit"]
    for entry in table["entries"]:
        params, source = lookup(entry["kernel"], entry["template"], entry["shape"], path.stem,
                                op_source_hash(catalog()[entry["kernel"]].op))
        assert params == entry["params"] and source.startswith(f"tuned {path.stem}")
        space = catalog()[entry["kernel"]].space  # an entry may predate a knob: its default
        assert space.violated(space.complete(params, entry["template"]), entry["template"]) is None


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.stem)
def test_every_suite_shape_resolves_to_its_entry(path):
    """Each catalog suite point of a kernel the table covers gets the params tuned there."""
    table = json.loads(path.read_text())
    at = {(e["kernel"], json.dumps(e["template"], sort_keys=True),
           json.dumps(e["shape"], sort_keys=True)): e for e in table["entries"]}
    covered = {e["kernel"] for e in table["entries"]}
    checked = 0
    for spec, template, shape in catalog().tasks():
        if spec.id not in covered:
            continue
        entry = at.get((spec.id, json.dumps(template, sort_keys=True),
                        json.dumps(shape, sort_keys=True)))
        assert entry is not None, f"{path.stem}: no {spec.id} entry at {shape}"
        params, source = lookup(spec.id, template, shape, path.stem)
        assert params == entry["params"], f"{spec.id} at {shape}: {source}"
        checked += 1
    assert checked


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.stem)
def test_an_untuned_shape_takes_the_nearest_entry(path):
    table = json.loads(path.read_text())
    pool = [e for e in table["entries"] if e["kernel"] == "pool.forward"]
    if not pool:
        pytest.skip(f"{path.stem} has no pool.forward entries")
    target = {"B": 3000, "K": 250}
    nearest = min(pool, key=lambda e: sum(abs(np.log(e["shape"][k] / target[k])) for k in target))
    params, source = lookup("pool.forward", nearest["template"], target, path.stem)
    assert params == nearest["params"] and "B=" in source


def test_no_table_means_the_default():
    params, source = lookup("pool.forward", {"N_HORIZONS": 5, "HIDDEN_DIM": 128},
                            {"B": 8, "K": 8}, "no-such-gpu")
    assert params is None and source.startswith("default")


@pytest.mark.gpu
def test_ops_launch_with_the_shipped_table_on_this_gpu():
    import pycuda_heads as ph
    from pycuda_heads.core.device import gpu_slug
    from pycuda_heads.core.tuned import load_table
    table = load_table(gpu_slug())
    if table is None:
        pytest.skip(f"no tuned table ships for {gpu_slug()}")
    entry = next((e for e in table["entries"] if e["kernel"] == "gate.forward"), None)
    if entry is None:
        pytest.skip("the shipped table has no gate.forward entry")
    rng = np.random.default_rng(0)
    b = entry["shape"]["B"]
    gate = ph.AlphaGate(5)
    gate.forward(*(rng.standard_normal(s, dtype=np.float32) for s in ((b, 5), (b, 5), (5,))))
    assert gate.chosen["forward"]["params"] == entry["params"]
    assert gate.chosen["forward"]["source"].startswith(f"tuned {gpu_slug()} gate.forward")


def test_a_tuned_entry_that_cannot_run_the_shape_gives_way_to_the_default(monkeypatch):
    """Without a GPU: the op's state as its constructor leaves it, the table lookup stubbed."""
    from pycuda_heads.core import op as op_module
    from pycuda_heads.core.space import KernelSpace

    class Toy(op_module.Op):
        FAMILY = "toy"
        SPACES = {"k": KernelSpace(kernel="toy.k", params={"BLOCK": (64, 128, 256)},
                                   default={"BLOCK": 256}, launch_restrictions=("BLOCK <= N",))}

    monkeypatch.setattr(op_module, "op_source_hash", lambda op: "h")
    monkeypatch.setattr(op_module, "lookup", lambda *a: ({"BLOCK": 128}, "tuned g toy.k at N=4096"))
    inst = object.__new__(Toy)
    inst.template, inst._user, inst._resolved, inst.chosen = {}, {}, {}, {}
    inst._slug, inst._max_shared = "g", 48 * 1024
    assert inst.launch_params("k", {"N": 4096}) == {"BLOCK": 128}
    # the tuned 128 and the default 256 both break BLOCK <= N: the default's nearest valid point
    assert inst.launch_params("k", {"N": 100}) == {"BLOCK": 64}
    assert inst.chosen["k"]["source"] == "default (tuned entry cannot run {'N': 100})"


def test_without_the_table_each_shape_gets_the_default_or_its_nearest_valid_point(monkeypatch):
    """What the bench's default column measures: the op with its table switched off."""
    from pycuda_heads.core import op as op_module
    from pycuda_heads.core.space import KernelSpace

    class Toy(op_module.Op):
        FAMILY = "toy"
        SPACES = {"k": KernelSpace(kernel="toy.k", params={"BLOCK": (64, 128, 256)},
                                   default={"BLOCK": 256}, launch_restrictions=("BLOCK <= N",))}

    monkeypatch.setattr(op_module, "lookup", lambda *a: pytest.fail("the table was consulted"))
    inst = object.__new__(Toy)
    inst.template, inst._user, inst._resolved, inst.chosen = {}, {}, {}, {}
    inst._slug, inst._max_shared, inst.use_table = "g", 48 * 1024, False
    assert inst.launch_params("k", {"N": 4096}) == {"BLOCK": 256}
    assert inst.launch_params("k", {"N": 100}) == {"BLOCK": 64}
    assert inst.chosen["k"]["source"] == "default (tuned table not used)"
