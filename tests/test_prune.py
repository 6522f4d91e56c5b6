"""CPU: ``prune`` keeps exactly the studies behind a table's entries, with their trials as
they were, and leaves the journal alone when a tuner writes to it meanwhile."""
import json

import pytest

optuna = pytest.importorskip("optuna")

from optuna.storages import JournalStorage  # noqa: E402
from optuna.storages.journal import JournalFileBackend  # noqa: E402

from pycuda_heads.cli import main  # noqa: E402
from pycuda_heads.tuning import prune  # noqa: E402

ENTRIES = [{"kernel": "gate.forward", "template": {"N_HORIZONS": 5}, "shape": {"B": 3},
            "source_hash": "aaaa"},
           {"kernel": "adam.step", "template": {}, "shape": {"N": 16384}, "source_hash": "bbbb"}]


def _journal(path, names):
    storage = JournalStorage(JournalFileBackend(str(path)))
    for i, name in enumerate(names):
        study = optuna.create_study(study_name=name, storage=storage)
        for x in range(i + 2):
            study.add_trial(optuna.trial.create_trial(params={"BLOCK": 32 * (x + 1)},
                                                      distributions={"BLOCK": optuna.distributions
                                                                     .IntDistribution(32, 512)},
                                                      value=float(x + i)))


def _trials(path):
    storage = JournalStorage(JournalFileBackend(str(path)))
    return {s.study_name: [(t.params, t.value) for t in storage.get_all_trials(s._study_id)]
            for s in storage.get_all_studies()}


def test_prune_keeps_the_studies_behind_the_table(tmp_path, capsys, monkeypatch):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    table = {"slug": "g", "entries": ENTRIES}
    keep = sorted(prune.study_names(table))
    assert keep == ["g:adam.step:none:N=16384:bbbb", "g:gate.forward:N_HORIZONS=5:B=3:aaaa"]
    journal = tmp_path / "reports" / "g" / "tuning" / "optuna.journal"
    journal.parent.mkdir(parents=True)
    stale = "g:gate.forward:N_HORIZONS=5:B=3:old0"
    _journal(journal, [keep[0], stale, keep[1]])
    before = _trials(journal)
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "g.json").write_text(json.dumps(table))  # the installed table
    monkeypatch.setenv("PYCUDA_HEADS_TUNED_DIR", str(tmp_path / "tables"))
    status = main(["prune", "--gpu", "g", "--out", str(tmp_path / "reports")])
    assert status == 0
    assert "kept 2 studies, dropped 1" in capsys.readouterr().out
    after = _trials(journal)
    assert after == {name: before[name] for name in keep}


def test_prune_refuses_while_a_tuner_writes(tmp_path, monkeypatch):
    journal = tmp_path / "optuna.journal"
    _journal(journal, ["a", "b"])
    real = optuna.copy_study

    def copy_and_append(**kwargs):  # a tuner appends while the copy is made
        real(**kwargs)
        with open(journal, "a") as f:
            f.write(open(journal).readline())
    monkeypatch.setattr(optuna, "copy_study", copy_and_append)
    size = journal.stat().st_size
    with pytest.raises(RuntimeError, match="grew while it was pruned"):
        prune.prune_journal(journal, {"a"})
    assert journal.stat().st_size > size and not list(tmp_path.glob("*.tmp"))
