"""CPU: the committed GPU validation record matches the sources in this checkout, family by
family: a kernel change that was not re-validated on a GPU fails CI for its own family only."""
import json
from pathlib import Path

import pytest

from pycuda_heads import records
from pycuda_heads.catalog import catalog
from pycuda_heads.core.op import op_source_hash
from pycuda_heads.core.source import render, variant_hash
from pycuda_heads.core.tuned import TABLE_DIR
from pycuda_heads.verify.validation import merge_record, stale_families

REPORTS = Path(__file__).resolve().parent.parent / "reports"
RECORDS = sorted(REPORTS.glob(f"*/{records.VALIDATION_JSON}"))


def test_a_gpu_validation_record_is_committed():
    assert RECORDS, "no reports/<gpu>/validation.json; run `pycuda-heads validate` on a GPU"


@pytest.mark.parametrize("family", sorted(catalog().families()))
@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.parent.name)
def test_each_family_is_validated_at_its_current_sources(path, family):
    record = json.loads(path.read_text())
    problem = stale_families(record, catalog()).get(family)
    assert problem is None, (f"{path}: {family}: {problem}; run `pycuda-heads validate "
                             f"--kernels {family}` on the GPU")
    for v in record["variants"]:
        if catalog()[v["kernel"]].family == family:
            assert v["passed"], f"{v['kernel']} {v['params']} failed on {path.parent.name}"


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.parent.name)
def test_the_record_names_only_known_kernels(path):
    record = json.loads(path.read_text())
    unknown = {v["kernel"] for v in record["variants"]} - set(catalog().specs)
    assert not unknown, f"{path}: unknown kernels {sorted(unknown)}; re-run validate"


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


def test_a_run_over_one_family_keeps_every_other_familys_entries():
    """``validate --kernels gate``: the gate's variants and run are replaced, the rest of the
    record is left byte for byte."""
    cat = catalog()
    old = {"gpu": "G", "gpu_slug": "g", "date": "d0", "commit": "c0",
           "families": {f: {"source_hash": "old", "commit": "c0"} for f in cat.families()},
           "variants": [{"kernel": s.id, "params": dict(s.space.default), "passed": True,
                         "runs": [{}], "source_hash": "old"} for s in cat]}
    from pycuda_heads.catalog import SUITE_TEMPLATE
    gate = [{"kernel": s.id, "params": dict(s.space.default), "passed": True, "runs": [{}, {}],
             "template": s.template(SUITE_TEMPLATE), "source_hash": op_source_hash(s.op),
             "variant_hash": variant_hash(render(s.family, {**s.template(SUITE_TEMPLATE),
                                                            **s.space.default}))}
            for s in cat.families()["gate"]]
    run = {"gpu": "G", "gpu_slug": "g", "date": "d1", "commit": "c1", "seconds": 1.0,
           "sanitized": False}
    new = merge_record(old, gate, run, cat)
    others = lambda r: [v for v in r["variants"] if not v["kernel"].startswith("gate.")]  # noqa: E731
    assert json.dumps(others(new)) == json.dumps(others(old))
    assert [v for v in new["variants"] if v["kernel"].startswith("gate.")] == gate
    assert new["families"]["gate"]["commit"] == "c1"
    assert all(new["families"][f] == old["families"][f] for f in cat.families() if f != "gate")
    assert [v["kernel"] for v in new["variants"]] == [s.id for s in cat]  # catalog order
    stale = stale_families(new, cat)
    assert "gate" not in stale and set(stale) == set(cat.families()) - {"gate"}


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
    cat = catalog()
    table = {"entries": [{"kernel": "pool.forward", "template": wide,
                          "shape": {"B": 1024, "K": 128}, "params": params,
                          "source_hash": op_source_hash(cat["pool.forward"].op)}]}
    *_, (spec, got_params, source, shapes, template) = validation.variants_to_check(cat, table)
    assert (spec.id, got_params, source, template) == ("pool.forward", params, "tuned", wide)
    assert shapes == [(wide, {"B": 1024, "K": 128})]
    v = validation.variant_record(spec, got_params, source, shapes, template)
    assert v["template"] == wide and v["runs"][0]["template"] == wide
    assert v["source_hash"] == op_source_hash(spec.op)
    assert v["variant_hash"] == variant_hash(render(spec.family, {**wide, **params},
                                                    spec.source_dir))
    suite = spec.template(SUITE_TEMPLATE)
    assert v["variant_hash"] != variant_hash(render(spec.family, {**suite, **params},
                                                    spec.source_dir))


def test_an_entry_tuned_for_other_sources_is_not_validated_as_tuned():
    """The op never applies a stale entry, so validate does not check it as a tuned variant."""
    from pycuda_heads.verify import validation
    cat = catalog()
    entry = {"kernel": "gate.forward", "template": {"N_HORIZONS": 5}, "shape": {"B": 3},
             "params": {"BLOCK": 64, "ITEMS": 2}}
    fresh = {**entry, "source_hash": op_source_hash(cat["gate.forward"].op)}
    stale = {**entry, "source_hash": "0123456789abcdef"}
    tuned = lambda e: [v for v in validation.variants_to_check(cat, {"entries": [e]})  # noqa: E731
                       if v[2] == "tuned"]
    assert len(tuned(fresh)) == 1 and tuned(stale) == []
