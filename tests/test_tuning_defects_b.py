"""CPU: the tuning commands on bad input: a file given as --storage that is not a journal is
refused and left as it was; a record torn by a killed writer costs only that record, in the live
workers and on resume; malformed caches, tables and arguments end in one line naming them and
exit status 2; efficiency merges into the shipped table instead of replacing it."""
import json
from pathlib import Path

import pytest

optuna = pytest.importorskip(
    "optuna", reason="the tuner needs the tune extra: pip install -e '.[test]'")

from test_tuning import Comparing, gate_task, gate_time  # noqa: E402

from pycuda_heads.cli import main  # noqa: E402
from pycuda_heads.records import EFFICIENCY_JSON  # noqa: E402
from pycuda_heads.tuning.constraints import Feasibility  # noqa: E402
from pycuda_heads.tuning.storage import cache_path, open_storage, tuning_dir  # noqa: E402
from pycuda_heads.tuning.tune import tune  # noqa: E402

GOOD = ["--kernel", "pool.forward", "--shape", "B=2,K=8"]
COMPLETE = optuna.trial.TrialState.COMPLETE


def one_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


@pytest.fixture
def fake_gpu(monkeypatch):
    """`tune` and `sweep` with the GPU parts replaced, as in test_tuning."""
    from pycuda_heads.tuning import constraints, objective
    fake = objective.GpuContext("Fake H200", "fake-h200", "sm_90", 227 * 1024)
    monkeypatch.setattr(objective.GpuContext, "current", classmethod(lambda cls: fake))
    monkeypatch.setattr(objective.GpuContext, "precompile", lambda self, items, workers: None)
    monkeypatch.setattr(constraints, "spec_static", lambda task, arch: lambda p: None)

    class FakeGpuEvaluator(Comparing):
        def __init__(self, task, reps, warmup):
            super().__init__(fail=(), time_fn=lambda p: 1 + len(str(sorted(p.items()))) % 7)

    monkeypatch.setattr(objective, "GpuEvaluator", FakeGpuEvaluator)


@pytest.fixture
def no_gpu_work(monkeypatch):
    from pycuda_heads.tuning import objective
    monkeypatch.setattr(objective.GpuContext, "current",
                        classmethod(lambda cls: pytest.fail("GPU work before the checks")))


def tune_cli(tmp_path, *extra) -> int:
    return main(["tune", *GOOD, "--trials", "2", "--out", str(tmp_path / "reports"),
                 "--no-progress", *extra])


# --- 1 and 3: --storage given a file that is not a journal -----------------------------------

NOT_JOURNALS = {
    "one line, no newline": b"my notes, not a journal",
    "json object, no newline": b'{"a": 1}',
    "text lines": b"first\nsecond\n",
    "json lines": b'{"a": 1}\n{"b": 2}\n',
}


@pytest.mark.parametrize("content", NOT_JOURNALS.values(), ids=NOT_JOURNALS)
def test_storage_that_is_not_a_journal_is_refused_and_kept(tmp_path, fake_gpu, capsys, content):
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    assert tune_cli(tmp_path, "--storage", str(path)) == 2
    line = one_line(capsys)
    assert str(path) in line and "not an Optuna journal" in line
    assert path.read_bytes() == content


def test_sqlite_storage_that_is_not_a_database_is_refused(tmp_path, fake_gpu, capsys):
    path = tmp_path / "x.db"
    path.write_text("not a database\n" * 100)
    assert tune_cli(tmp_path, "--storage", f"sqlite:///{path}") == 2
    assert str(path) in one_line(capsys)
    assert path.read_text() == "not a database\n" * 100


def journal_with_trials(path: Path, n: int) -> optuna.Study:
    study = optuna.create_study(study_name="s", storage=open_storage(str(path), path.parent))
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=n)
    return study


def test_a_torn_last_line_is_cut_after_complete_records_only(tmp_path):
    journal = tmp_path / "optuna.journal"
    journal_with_trials(journal, 2)
    whole = journal.read_bytes()
    journal.write_bytes(whole + whole.splitlines()[-1][:20])  # a writer killed mid-append
    study = optuna.load_study(study_name="s", storage=open_storage(str(journal), tmp_path))
    assert journal.read_bytes() == whole and len(study.trials) == 2


# --- 2: a torn record followed by another writer's append -------------------------------------

@pytest.mark.parametrize("cut", [1, 0.5, -1], ids=["first byte", "half", "all but newline"])
def test_a_torn_record_inside_the_journal_costs_only_that_record(tmp_path, cut):
    journal = tmp_path / "optuna.journal"
    live = journal_with_trials(journal, 2)  # a worker that keeps running
    reader = optuna.load_study(study_name="s", storage=open_storage(str(journal), tmp_path))
    record = journal.read_bytes().splitlines()[-1]
    with open(journal, "ab") as f:  # another worker killed in the middle of its append
        f.write(record[:int(cut * len(record)) if cut != -1 else len(record)])
    live.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)  # on the torn line, then on
    assert [t.state for t in live.trials] == [COMPLETE] * 5
    assert len(reader.trials) == 5
    resumed = optuna.load_study(study_name="s", storage=open_storage(str(journal), tmp_path))
    resumed.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    assert [t.state for t in resumed.trials] == [COMPLETE] * 6
    assert len(live.trials) == 6


def test_a_corrupt_line_inside_the_journal_names_the_file(tmp_path):
    journal = tmp_path / "optuna.journal"
    journal_with_trials(journal, 1)
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(lines[0] + b"garbage\n" + b"".join(lines[1:]))
    with pytest.raises(ValueError, match=rf"{journal} line 2 is corrupt"):
        open_storage(str(journal), tmp_path)


# --- 3: malformed caches ----------------------------------------------------------------------

def test_tune_names_a_cache_whose_history_names_no_study(tmp_path, fake_gpu, capsys):
    assert tune_cli(tmp_path) == 0
    [cache] = (tmp_path / "reports" / "fake-h200" / "tuning").glob("pool.forward__*.json")
    data = json.loads(cache.read_text())
    del data["history"][0]["study"]
    cache.write_text(json.dumps(data))
    capsys.readouterr()
    assert tune_cli(tmp_path) == 2
    assert str(cache) in one_line(capsys)


def gate_caches(reports: Path, shapes=(4096,)) -> list[Path]:
    paths = []
    for b in shapes:
        task = gate_task({"B": b})
        tune(task, Comparing(fail=(), time_fn=gate_time), Feasibility(task), out=reports,
             mode="exhaustive")
        paths.append(cache_path(tuning_dir(reports, task.slug), task))
    return paths


def _no_study(data):
    del data["history"][0]["study"]
    return data


def _no_shape(data):
    del data["shape"]
    return data


BROKEN = {"holds []": lambda data: [], "history without study": _no_study,
          "no shape": _no_shape}


@pytest.mark.parametrize("command", ["export", "efficiency"])
@pytest.mark.parametrize("broken", BROKEN.values(), ids=BROKEN)
def test_export_and_efficiency_name_a_malformed_cache(tmp_path, capsys, command, broken):
    [cache] = gate_caches(tmp_path)
    cache.write_text(json.dumps(broken(json.loads(cache.read_text()))))
    extra = [] if command == "export" else ["--seeds", "1"]
    assert main([command, "--out", str(tmp_path), *extra]) == 2
    assert str(cache) in one_line(capsys)


def test_export_out_given_a_file_is_refused(tmp_path, capsys):
    gate_caches(tmp_path)
    out = tmp_path / "table.json"
    out.write_text("keep me")
    assert main(["export", "--out", str(out)]) == 2
    assert str(out) in one_line(capsys) and out.read_text() == "keep me"


# --- 4: efficiency merges with the shipped table ----------------------------------------------

def test_efficiency_keeps_the_entries_it_did_not_replay(tmp_path, capsys):
    gate_caches(tmp_path, shapes=(4096, 3))
    table = tuning_dir(tmp_path, "toy-gpu") / EFFICIENCY_JSON
    shipped = [{"kernel": "residual.forward", "shape": {"B": 3}, "median_trials_to_3pct": 7.0},
               {"kernel": "gate.forward", "shape": {"B": 4096}, "median_trials_to_3pct": 99.0}]
    table.write_text(json.dumps(shipped))
    assert main(["efficiency", "--out", str(tmp_path), "--gpu", "toy-gpu",
                 "--seeds", "1"]) == 0
    rows = json.loads(table.read_text())
    assert rows[:2] == shipped  # kept as shipped, the one of B=4096 too (no --replace)
    assert [(r["kernel"], r["shape"]) for r in rows[2:]] == [("gate.forward", {"B": 3})]
    assert main(["efficiency", "--out", str(tmp_path), "--seeds", "1", "--replace"]) == 0
    rows = json.loads(table.read_text())
    assert rows[0] == shipped[0] and len(rows) == 3
    assert rows[1]["shape"] == {"B": 4096} and rows[1]["median_trials_to_3pct"] != 99.0


# --- 5: arguments -----------------------------------------------------------------------------

def test_a_repeated_shape_axis_is_refused(no_gpu_work, capsys):
    assert main(["tune", "--kernel", "gate.forward", "--shape", "B=3,B=4"]) == 2
    line = one_line(capsys)
    assert "--shape" in line and "B given more than once" in line


def test_an_empty_kernel_selection_is_refused(no_gpu_work, capsys):
    assert main(["sweep", "--kernels", ""]) == 2
    assert "--kernels" in one_line(capsys)


def test_efficiency_names_an_unknown_slug_and_the_known_ones(tmp_path, capsys):
    gate_caches(tmp_path)
    assert main(["efficiency", "--out", str(tmp_path), "--gpu", "nosuch"]) == 2
    line = one_line(capsys)
    assert "nosuch" in line and "toy-gpu" in line
    assert not (tmp_path / "nosuch").exists()
