"""CPU: a tuned entry applies only to the sources it was tuned on: the kernel, its host launch
code and the ops it calls. Edit any of them and the op falls back to its default, saying why."""
import importlib.util
import json
import sys

import pytest

pytest.importorskip(
    "optuna", reason="the tuner needs the tune extra: pip install -e '.[test]'")
from pycuda_heads.tuning.export import build_table, export
from pycuda_heads.tuning.spaces import TuningTask
from pycuda_heads.tuning.storage import cache_files, tuning_dir
from pycuda_heads.tuning.tune import tune
from test_tuning import Comparing, Feasibility

from pycuda_heads.core import source
from pycuda_heads.core.op import op_source_hash
from pycuda_heads.core.space import KernelSpace
from pycuda_heads.core.tuned import lookup

TOY_CU = """// toy: y = 2 x
extern "C" __global__ void stale_scale(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""
TOY_OP = """
from pathlib import Path
from pycuda_heads.core.op import Op
from pycuda_heads.core.space import KernelSpace

class Stale(Op):
    FAMILY = "stale"
    SOURCE_DIR = Path(__file__).parent
    SPACES = {"scale": KernelSpace(kernel="stale.scale", params={"BLOCK": (64, 128, 256)},
                                   default={"BLOCK": 128})}

def grid(n, block):  # host launch code
    return (-(-n // block), 1, 1)
"""
BEST = {"BLOCK": 256}


@pytest.fixture
def toy(tmp_path, monkeypatch):
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "stale.cu").write_text(TOY_CU)
    (folder / "stale_op.py").write_text(TOY_OP)

    def load():
        for cache in (op_source_hash, source._read):  # what a fresh process would see
            cache.cache_clear()
        spec = importlib.util.spec_from_file_location("stale_op", folder / "stale_op.py")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, "stale_op", module)
        spec.loader.exec_module(module)
        return module.Stale

    yield folder, load
    op_source_hash.cache_clear()
    source._read.cache_clear()


def tuned_table(tmp_path, op, monkeypatch):
    """Tune and export the toy op; the table folder becomes the one ops read."""
    space = op.SPACES["scale"]
    task = TuningTask("stale.scale", space, {}, {"N": 4096}, "Toy GPU", "toy-gpu",
                      source_hash=op_source_hash(op))
    tune(task, Comparing(fail=(), time_fn=lambda p: 10 - p["BLOCK"] / 64), Feasibility(task),
         out=tmp_path, mode="exhaustive")
    export(tmp_path, "toy-gpu", tmp_path / "tables", installed=lambda k: op_source_hash(op))
    monkeypatch.setenv("PYCUDA_HEADS_TUNED_DIR", str(tmp_path / "tables"))


def launch_choice(op):
    """``op.launch_params`` without a GPU: the op's state as its constructor leaves it."""
    inst = object.__new__(op)
    inst.template, inst._user, inst._resolved, inst.chosen = {}, {}, {}, {}
    inst._slug, inst._max_shared = "toy-gpu", 48 * 1024
    inst.launch_params("scale", {"N": 4096})
    return inst.chosen["scale"]


@pytest.mark.parametrize("edit", ["kernel comment", "host launch code"])
def test_an_edited_kernel_gets_the_default_back(tmp_path, toy, monkeypatch, edit):
    folder, load = toy
    op = load()
    tuned_table(tmp_path, op, monkeypatch)
    assert launch_choice(op) == {"params": BEST, "source": "tuned toy-gpu stale.scale at N=4096"}
    if edit == "kernel comment":
        (folder / "stale.cu").write_text(TOY_CU.replace("// toy: y = 2 x", "// toy: y = x + x"))
    else:
        (folder / "stale_op.py").write_text(TOY_OP.replace("-(-n // block)", "(n + block - 1) // block"))
    op = load()
    chosen = launch_choice(op)
    assert chosen["params"] == {"BLOCK": 128}
    assert "other kernel sources" in chosen["source"] and "re-run" in chosen["source"]
    # export skips the stale cache instead of shipping it again
    with pytest.raises(FileNotFoundError, match="installed sources"):
        build_table(tmp_path, "toy-gpu", installed=lambda k: op_source_hash(op))


def test_the_hash_covers_the_ops_an_op_calls():
    from pycuda_heads.core.op import _modules_used
    from pycuda_heads.ops import gate, reduce
    assert reduce in _modules_used(gate) and _modules_used(reduce) == [reduce]


def test_lookup_without_a_hash_keeps_the_old_behaviour(tmp_path, monkeypatch):
    space = KernelSpace(kernel="x.y", params={"B": (1, 2)}, default={"B": 1})
    (tmp_path / "g.json").write_text(json.dumps({"entries": [
        {"kernel": "x.y", "template": {}, "shape": {"N": 8}, "params": {"B": 2},
         "validated": True, "source_hash": "aaaa"}]}))
    monkeypatch.setenv("PYCUDA_HEADS_TUNED_DIR", str(tmp_path))
    assert lookup(space.kernel, {}, {"N": 8}, "g")[0] == {"B": 2}
    assert lookup(space.kernel, {}, {"N": 8}, "g", "aaaa")[0] == {"B": 2}
    assert lookup(space.kernel, {}, {"N": 8}, "g", "bbbb")[0] is None


def test_export_keeps_a_shipped_entry_that_restamp_carried_over(tmp_path, toy, monkeypatch):
    """A cache whose kernel was edited is stale, but the shipped table's entry proven to
    compile as before (``restamp``: its source_hash moved to the installed sources) survives a
    re-export; one still at the old sources does not."""
    folder, load = toy
    op = load()
    tuned_table(tmp_path, op, monkeypatch)
    shipped = json.loads((tmp_path / "tables" / "toy-gpu.json").read_text())["entries"]
    (folder / "stale.cu").write_text(TOY_CU.replace("// toy: y = 2 x", "// toy: y = x + x"))
    op = load()
    now = op_source_hash(op)
    with pytest.raises(FileNotFoundError, match="installed sources"):
        build_table(tmp_path, "toy-gpu", installed=lambda k: now, shipped=shipped)
    restamped = [{**e, "source_hash": now} for e in shipped]
    table = build_table(tmp_path, "toy-gpu", installed=lambda k: now, shipped=restamped)
    assert table["entries"] == restamped and table["entries"][0]["params"] == BEST
    assert table["provenance"]["entries_kept_from_the_shipped_table"] == 1
    assert table["provenance"]["stale_caches_skipped"] == []
    # export reads the installed table itself
    (tmp_path / "tables" / "toy-gpu.json").write_text(json.dumps({"entries": restamped}))
    path = export(tmp_path, "toy-gpu", tmp_path / "out", installed=lambda k: now)
    assert json.loads(path.read_text())["entries"] == restamped


def test_export_keeps_the_shipped_entry_while_its_re_tune_is_unfinished(tmp_path, toy,
                                                                         monkeypatch):
    """A re-tune at the installed sources cut short before its best was compared with the
    default (no comparison, or one on an earlier best) would ship the default in place of a
    tuned entry; the shipped entry stays instead, and the finished re-tune replaces it."""
    folder, load = toy
    op = load()
    tuned_table(tmp_path, op, monkeypatch)
    shipped = json.loads((tmp_path / "tables" / "toy-gpu.json").read_text())["entries"]
    [cache] = cache_files(tuning_dir(tmp_path, "toy-gpu"))
    finished = json.loads(cache.read_text())
    now = op_source_hash(op)
    slower = [{**e, "time_us": 99.0} for e in shipped]  # tells the kept entry from a rebuilt one
    earlier = {**finished["comparison"], "params": {"BLOCK": 64}}
    for comparison in (None, earlier):
        cache.write_text(json.dumps({**finished, "comparison": comparison}))
        table = build_table(tmp_path, "toy-gpu", installed=lambda k: now, shipped=slower)
        assert table["entries"] == slower
        assert table["provenance"]["entries_kept_from_the_shipped_table"] == 1
    # without a shipped entry the unfinished cache gives the default, as before
    assert build_table(tmp_path, "toy-gpu", installed=lambda k: now)["entries"][0]["params"] \
        == {"BLOCK": 128}
    cache.write_text(json.dumps(finished))
    [entry] = build_table(tmp_path, "toy-gpu", installed=lambda k: now, shipped=slower)["entries"]
    assert entry["params"] == BEST and entry["time_us"] != 99.0
