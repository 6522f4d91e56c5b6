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


def test_a_tuned_entry_is_recorded_and_hashed_at_its_own_template(monkeypatch):
    """A pool entry tuned at a wide model size: its record's template is that size, and its
    variant_hash is of the source rendered there (what the test above recomputes)."""
    from pycuda_heads.catalog import SUITE_TEMPLATE
    from pycuda_heads.verify import cases, checks, validation
    monkeypatch.setattr(cases, "Case", lambda spec, shape, params, template: template)
    monkeypatch.setattr(checks, "validate_case", lambda case: {
        "passed": True, "max_rel_err": 0.0, "checks": {}, "failures": []})
    wide = {"N_HORIZONS": 8, "HIDDEN_DIM": 512}
    params = {"BLOCK": 128, "VEC": 4, "UNROLL": 1, "LAYOUT": 1}
    table = {"entries": [{"kernel": "pool.forward", "template": wide,
                          "shape": {"B": 1024, "K": 128}, "params": params}]}
    cat = catalog()
    *_, (spec, got_params, source, shapes, template) = validation.variants_to_check(cat, table)
    assert (spec.id, got_params, source, template) == ("pool.forward", params, "tuned", wide)
    assert shapes == [(wide, {"B": 1024, "K": 128})]
    v = validation.variant_record(spec, got_params, source, shapes, template)
    assert v["template"] == wide and v["runs"][0]["template"] == wide
    assert v["variant_hash"] == variant_hash(render(spec.family, {**wide, **params},
                                                    spec.source_dir))
    suite = spec.template(SUITE_TEMPLATE)
    assert v["variant_hash"] != variant_hash(render(spec.family, {**suite, **params},
                                                    spec.source_dir))
