"""CPU: `validate --sanitize` with a fake compute-sanitizer on the PATH: the command it is given,
the parsing of its "ERROR SUMMARY" and the findings in the validation record."""
import json
import logging
import os
import stat
import sys

import pytest

from pycuda_heads.catalog import catalog
from pycuda_heads.verify import validation

FAKE = """#!{python}
import json, os, sys
args = sys.argv[1:]
tool = args[args.index("--tool") + 1]
with open({log!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
errors = 0 if os.environ.get("FAKE_CLEAN") else {{"racecheck": 2, "synccheck": None}}.get(tool, 0)
if errors is None:
    print("Segmentation fault")
    sys.exit(139)
print("========= COMPUTE-SANITIZER")
if tool == "racecheck":  # racecheck's own summary line, as compute-sanitizer 2025 prints it
    print(f"========= RACECHECK SUMMARY: {{errors}} hazards displayed (1 errors, 1 warnings)")
else:
    print(f"========= ERROR SUMMARY: {{errors}} error{{'' if errors == 1 else 's'}}")
sys.exit(86 if errors else 0)
"""


@pytest.fixture
def fake_sanitizer(tmp_path, monkeypatch):
    log = tmp_path / "calls.jsonl"
    script = tmp_path / "bin" / "compute-sanitizer"
    script.parent.mkdir()
    script.write_text(FAKE.format(python=sys.executable, log=str(log)))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    return log


def test_each_tool_runs_the_variant_at_its_smallest_shape(fake_sanitizer):
    spec = catalog()["gate.backward"]
    shapes = [({"N_HORIZONS": 5}, {"B": 1000}), ({"N_HORIZONS": 1}, {"B": 7}),
              ({"N_HORIZONS": 5}, {"B": 1})]  # B=1 would leave one row per block: not chosen
    found = validation.sanitize(spec, {"BLOCK": 64, "ROWS": 256}, shapes)
    assert list(found) == list(validation.SANITIZER_TOOLS)
    assert found["memcheck"]["errors"] == 0 and found["initcheck"]["exit"] == 0
    assert found["racecheck"]["errors"] == 2 and found["racecheck"]["exit"] == 86
    assert found["synccheck"]["errors"] is None and "Segmentation" in found["synccheck"]["log"]
    assert validation.findings(found) == 3
    calls = [json.loads(line) for line in fake_sanitizer.read_text().splitlines()]
    assert [c[c.index("--tool") + 1] for c in calls] == list(validation.SANITIZER_TOOLS)
    for c in calls:
        assert c[c.index("--error-exitcode") + 1] == "86"
        assert c[-4:-1] == ["-m", "pycuda_heads.verify.validation", "gate.backward"]
        assert json.loads(c[-1]) == {"params": {"BLOCK": 64, "ROWS": 256},
                                     "template": {"N_HORIZONS": 1}, "shape": {"B": 7}}


@pytest.fixture
def fake_gpu(monkeypatch):
    """A GPU named 'Fake GPU' with no tuned table, whose variants validate without running;
    returns the rendered-source hash per kernel that the fake records (edit it to 'change' a
    kernel)."""
    from pycuda_heads.core import device, tuned
    monkeypatch.setattr(device, "gpu_name", lambda: "Fake GPU")
    monkeypatch.setattr(device, "gpu_slug", lambda: "fake-gpu")
    monkeypatch.setattr(tuned, "load_table", lambda slug: None)
    source_hash = {"reduce.axis0": "h0"}

    def record(spec, params, source, shapes, template):
        return {"kernel": spec.id, "source": source, "params": params, "passed": True,
                "runs": [], "variant_hash": source_hash[spec.id]}
    monkeypatch.setattr(validation, "variant_record", record)
    return source_hash


def test_findings_go_into_the_record_and_fail_the_variant(fake_sanitizer, fake_gpu, tmp_path,
                                                          caplog):
    with caplog.at_level(logging.INFO, "pycuda_heads"):
        record = validation.write_record(tmp_path, ["reduce.axis0"], "abc", sanitizer=True)
    # outside a terminal, each variant validated and each sanitized is a line of the log
    assert [r.getMessage() for r in caplog.records if r.name == "pycuda_heads.progress"] == [
        "validate: 1/1 variant (reduce.axis0 default)",
        "sanitize: 1/1 variant (reduce.axis0 default)"]
    [variant] = record["variants"]
    assert variant["sanitizer"]["racecheck"]["errors"] == 2 and not variant["passed"]
    assert record["summary"]["sanitizer_findings"] == 3
    assert record["summary"]["sanitizer_tools"] == list(validation.SANITIZER_TOOLS)
    assert record["summary"]["sanitizer_options"] == ["--report-api-errors", "no"]
    stored = json.loads((tmp_path / "fake-gpu" / "validation.json").read_text())
    assert stored["variants"][0]["sanitizer"]["memcheck"]["errors"] == 0


def test_sanitize_without_the_tool_is_one_line(tmp_path, monkeypatch, capsys):
    import argparse
    monkeypatch.setenv("PATH", str(tmp_path))
    p = argparse.ArgumentParser()
    validation.register(p.add_subparsers())
    args = p.parse_args(["validate", "--sanitize"])
    assert args.func(args) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and not captured.out


def test_sanitizer_shape_prefers_every_axis_at_least_2():
    shapes = [({}, {"B": 1, "K": 1}), ({}, {"B": 2, "K": 8}), ({}, {"B": 4, "K": 64})]
    assert validation.sanitizer_shape(shapes) == ({}, {"B": 2, "K": 8})
    assert validation.sanitizer_shape(shapes[:1]) == ({}, {"B": 1, "K": 1})


def test_an_unchanged_clean_variant_keeps_its_sanitizer_result(fake_sanitizer, fake_gpu,
                                                                tmp_path, monkeypatch):
    source_hash = fake_gpu
    monkeypatch.setenv("FAKE_CLEAN", "1")
    first = validation.write_record(tmp_path, ["reduce.axis0"], "abc", sanitizer=True)
    calls = len(fake_sanitizer.read_text().splitlines())
    assert calls == len(validation.SANITIZER_TOOLS) * len(first["variants"])
    second = validation.write_record(tmp_path, ["reduce.axis0"], "abd", sanitizer=True)
    assert len(fake_sanitizer.read_text().splitlines()) == calls  # nothing ran again
    assert second["variants"][0]["sanitizer"] == first["variants"][0]["sanitizer"]
    source_hash["reduce.axis0"] = "h1"  # the kernel source changed: it runs again
    validation.write_record(tmp_path, ["reduce.axis0"], "abe", sanitizer=True)
    assert len(fake_sanitizer.read_text().splitlines()) == 2 * calls


def _proof(kernel, template, params, equal, base="old", head="new"):
    return {"family": kernel.partition(".")[0],
            "base": {"revision": "r0", "source_hash": base},
            "head": {"revision": "r1", "source_hash": head},
            "variants": [{"kernel": kernel, "template": template, "params": params,
                          "equal": equal}]}


@pytest.mark.parametrize("equal", [True, False])
def test_an_identity_proof_carries_the_clean_result_of_a_variant_it_shows_unchanged(
        fake_sanitizer, tmp_path, monkeypatch, equal):
    """An edit elsewhere in the family changes every variant's rendered source and the family's
    hash; a variant the proof shows compiling as before keeps its clean result (and says where
    it came from), one it shows changed runs again."""
    from pycuda_heads.core import device, tuned
    from pycuda_heads.core.source import render, variant_hash
    monkeypatch.setattr(device, "gpu_name", lambda: "Fake GPU")
    monkeypatch.setattr(device, "gpu_slug", lambda: "fake-gpu")
    monkeypatch.setattr(tuned, "load_table", lambda slug: None)
    monkeypatch.setenv("FAKE_CLEAN", "1")
    installed = {"hash": "old", "render": "before the edit"}
    monkeypatch.setattr(validation, "op_source_hash", lambda op: installed["hash"])

    def record(spec, params, source, shapes, template):
        rendered = render(spec.family, {**template, **params}, spec.source_dir)
        return {"kernel": spec.id, "source": source, "template": dict(template),
                "params": dict(params), "passed": True, "runs": [],
                "source_hash": installed["hash"],
                "variant_hash": installed["render"] or variant_hash(rendered)}
    monkeypatch.setattr(validation, "variant_record", record)
    first = validation.write_record(tmp_path, ["reduce.axis0"], "c0", sanitizer=True)
    calls = len(fake_sanitizer.read_text().splitlines())
    [v] = first["variants"]
    installed.update(hash="new", render=None)
    proof = _proof(v["kernel"], v["template"], v["params"], equal)
    second = validation.write_record(tmp_path, ["reduce.axis0"], "c1", sanitizer=True,
                                     proofs=[proof])
    [w] = second["variants"]
    assert (len(fake_sanitizer.read_text().splitlines()) == calls) == equal
    assert w["sanitizer"]["memcheck"]["errors"] == 0 and w["passed"]
    if equal:
        assert w["sanitizer"] == v["sanitizer"]
        assert w["sanitizer_carried"] == {"commit": "c0", "source_hash": "old",
                                          "proof": {"base": "r0", "head": "r1"}}
    else:
        assert "sanitizer_carried" not in w


def test_validate_refuses_a_proof_of_other_sources_in_one_line(tmp_path, capsys):
    import argparse
    path = tmp_path / "proof.json"
    path.write_text(json.dumps(_proof("reduce.axis0", {}, {}, True, head="not-installed")))
    p = argparse.ArgumentParser()
    validation.register(p.add_subparsers())
    args = p.parse_args(["validate", "--proof", str(path)])
    assert args.func(args) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "prove them again" in captured.err
    assert not captured.out
