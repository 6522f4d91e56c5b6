"""CPU: distributed tuning on a real PostgreSQL server: two worker processes posing as two
machines (separate reports folders) share one study with the synthetic evaluator; one of them
is SIGKILLed mid-run and the other retries its trial once its heartbeat is overdue."""
import signal
import subprocess
import sys

import pytest

optuna = pytest.importorskip(
    "optuna", reason="the tuner needs the tune extra: pip install -e '.[test]'")
pytestmark = pytest.mark.installed  # workers run as new processes
from pg_server import Server
from test_tuning import toy_task
from test_tuning_workers import COUNTED, ENV, WORKER, finish

pytest.importorskip("psycopg", reason="needs psycopg: pip install '.[distributed]'")


@pytest.fixture(scope="module")
def postgres():
    try:
        server = Server()
    except (RuntimeError, OSError) as exc:
        pytest.skip(f"no PostgreSQL server could be started: {exc}")
    yield server
    server.stop()


@pytest.fixture
def url(postgres, request):
    """A fresh database per test."""
    import psycopg
    name = "t_" + request.node.name.lower().replace("[", "_").replace("]", "").replace("-", "_")
    with psycopg.connect(f"dbname=postgres user=postgres host={postgres.root}",
                         autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"postgresql://postgres@/{name}?host={postgres.root}"


def machine(tmp_path, name, url, *args):
    out = tmp_path / name
    return subprocess.Popen([sys.executable, str(WORKER), str(out), str(tmp_path / "timed.log"),
                             "--storage", url, "--host", name, *map(str, args)],
                            env=ENV, stderr=subprocess.PIPE, text=True)


def study(url):
    from pycuda_heads.tuning.storage import open_storage
    return optuna.load_study(study_name=toy_task().study_name, storage=open_storage(url, "."))


def started(tmp_path):
    return [line.split(" ", 2)[2] for line in (tmp_path / "timed.log").read_text().splitlines()
            if line.split(" ", 2)[1] == "start"]


def test_two_postgres_workers_share_one_study(tmp_path, url):
    finish(machine(tmp_path, "a", url, "--seed", 1, "--sleep", 0.01),
           machine(tmp_path, "b", url, "--seed", 2, "--sleep", 0.01))
    trials = study(url).trials
    assert sum(t.state in COUNTED for t in trials) == 40  # the limit of the whole study
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    timed = started(tmp_path)
    assert len(timed) == len(set(timed))  # no configuration timed on both machines
    # a trial without a worker is a valid-only sampler's redrawn proposal, never claimed
    owners = {t.system_attrs["worker"]["host"] for t in trials if "worker" in t.system_attrs}
    assert owners == {"a", "b"}


def test_a_sigkilled_postgres_worker_has_its_trial_retried(tmp_path, url):
    doomed = machine(tmp_path, "a", url, "--seed", 1, "--sleep", 0.05, "--kill", "timing:4")
    other = machine(tmp_path, "b", url, "--seed", 2, "--sleep", 0.05)
    doomed.communicate(timeout=240)
    assert doomed.returncode == -signal.SIGKILL
    finish(other)
    trials = study(url).trials
    assert sum(t.state in COUNTED for t in trials) == 40
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    [failed] = [t for t in trials if t.state == optuna.trial.TrialState.FAIL
                and "worker" in t.system_attrs]  # claimed: not a redrawn proposal
    assert failed.system_attrs["worker"]["host"] == "a"
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == failed.number]
    assert [(t.state in COUNTED, t.params, t.system_attrs["worker"]["host"])
            for t in retried] == [(True, failed.params, "b")]
