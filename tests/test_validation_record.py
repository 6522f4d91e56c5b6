"""CPU: the committed GPU validation record matches the kernel sources in this checkout, so a
kernel change that was not re-validated on a GPU fails CI."""
import json
from pathlib import Path

import pytest

from pycuda_heads import records
from pycuda_heads.catalog import catalog
from pycuda_heads.core.source import render, sources_hash, variant_hash
from pycuda_heads.core.tuned import TABLE_DIR

REPORTS = Path(__file__).resolve().parent.parent / "reports"
RECORDS = sorted(REPORTS.glob(f"*/{records.VALIDATION_JSON}"))


def test_a_gpu_validation_record_is_committed():
    assert RECORDS, "no reports/<gpu>/validation.json; run `pycuda-heads validate` on a GPU"


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.parent.name)
def test_record_matches_current_sources_and_passes(path):
    record = json.loads(path.read_text())
    assert record["sources_hash"] == sources_hash(), (
        f"{path}: kernel sources changed since the record was written; re-run "
        f"`pycuda-heads validate` on the GPU")
    cat = catalog()
    for v in record["variants"]:
        assert v["kernel"] in cat, f"{path}: unknown kernel {v['kernel']!r}; re-run validate"
        spec = cat[v["kernel"]]
        now = variant_hash(render(spec.family, {**v["template"], **v["params"]}, spec.source_dir))
        assert v["variant_hash"] == now, f"{v['kernel']} {v['params']}: rendered source changed"
        assert v["passed"], f"{v['kernel']} {v['params']} failed on {path.parent.name}"
    defaults = {(v["kernel"], json.dumps(v["params"], sort_keys=True)) for v in record["variants"]}
    for spec in cat:
        assert (spec.id, json.dumps(dict(spec.space.default), sort_keys=True)) in defaults


@pytest.mark.parametrize("table", sorted(TABLE_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_every_shipped_tuned_variant_is_validated(table):
    record_path = REPORTS / table.stem / records.VALIDATION_JSON
    assert record_path.is_file(), f"tuned table {table.name} has no validation record"
    record = json.loads(record_path.read_text())
    passed = {(v["kernel"], json.dumps(v["params"], sort_keys=True))
              for v in record["variants"] if v["passed"]}
    for entry in json.loads(table.read_text())["entries"]:
        key = (entry["kernel"], json.dumps(entry["params"], sort_keys=True))
        assert key in passed, f"tuned {entry['kernel']} {entry['params']} is not in the record"
