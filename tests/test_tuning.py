"""CPU: the tuner's logic on a synthetic objective with a known optimum (no GPU, no PyCUDA):
constraints, validation, resume, exhaustive search, export -> lookup, fallback, efficiency."""
import argparse
import dataclasses
import itertools
import json
import math
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

optuna = pytest.importorskip(
    "optuna", reason="the tuner needs the tune extra: pip install -e '.[test]'")
from pycuda_heads.tuning import cli
from pycuda_heads.tuning.constraints import Feasibility
from pycuda_heads.tuning.efficiency import run_efficiency
from pycuda_heads.tuning.export import build_table, export
from pycuda_heads.tuning.progress import Budget
from pycuda_heads.tuning.session import EvaluatorBroken
from pycuda_heads.tuning.spaces import (STARTUP_TRIALS, TuningTask, all_points, distributions,
                                        point_key)
from pycuda_heads.tuning.storage import cache_path, open_storage, tuning_dir
from pycuda_heads.tuning.sweep import RUN_ENV, WorkerRun, run_sweep
from pycuda_heads.tuning.tune import tune

from pycuda_heads.catalog import catalog
from pycuda_heads.core.space import KernelSpace
from pycuda_heads.core.tuned import lookup
from pycuda_heads.records import EFFICIENCY_JSON, RUNS_JSON, dims_label, parse_dims

optuna.logging.set_verbosity(optuna.logging.WARNING)

TOY = KernelSpace(
    kernel="toy.kernel",
    params={"BLOCK": (32, 64, 128, 256, 512, 1024), "ITEMS": (1, 2, 4, 8), "VEC": (1, 2, 4)},
    default={"BLOCK": 128, "ITEMS": 1, "VEC": 1},
    restrictions=("BLOCK * ITEMS <= 2048",))
VEC_COST = {4: 0.0, 2: 1.5, 1: 3.5}
FASTEST = {"BLOCK": 256, "ITEMS": 4, "VEC": 4}  # 10 us, but it fails validation
BEST_VALID = {"BLOCK": 256, "ITEMS": 4, "VEC": 2}  # 11.5 us, the unique runner-up
ATOMIC = "static check: atomic instruction atom.global.add.f32"


def toy_time(p):
    return 10 + 2 * abs(math.log2(p["BLOCK"] / 256)) + 3 * abs(math.log2(p["ITEMS"] / 4)) \
        + VEC_COST[p["VEC"]]


def toy_static(p):
    return ATOMIC if p["BLOCK"] == 512 and p["VEC"] == 2 else None


class Synthetic:
    """Evaluator with a known optimum; records every call so tests can count them."""

    def __init__(self, fail=(FASTEST,), raise_on=(), interrupt_after=None, time_fn=toy_time):
        self.fail = [dict(p) for p in fail]
        self.raise_on = [dict(p) for p in raise_on]
        self.interrupt_after = interrupt_after
        self.time_fn = time_fn
        self.timed, self.validated = [], []

    def time(self, params):
        if self.interrupt_after is not None and len(self.timed) >= self.interrupt_after:
            raise KeyboardInterrupt  # a user's ^C (or any kill) in the middle of a timing
        self.timed.append(dict(params))
        if params in self.raise_on:
            raise RuntimeError("launch of toy failed: an illegal memory access")
        t = self.time_fn(params)
        return {"median_us": t, "p20_us": 0.98 * t, "p80_us": 1.02 * t, "reps": 30}

    def validate(self, params):
        self.validated.append(dict(params))
        if params in self.fail:
            return False, "parity numgrad: grad_ln max rel err 3e-2 > 1e-3"
        return True, None


class Comparing(Synthetic):
    """Also times two configurations interleaved (as the GPU evaluator does), so the tuner can
    decide whether the best beats the default beyond noise and the export ships it. With
    ``tie`` both get the same samples: never faster beyond noise."""

    def __init__(self, *args, tie=False, **kw):
        super().__init__(*args, **kw)
        self.tie = tie
        self.compared = []

    def interleaved(self, a, b, rounds=6, reps=5):
        self.compared.append((dict(a), dict(b)))
        jitter = [1 + 0.005 * ((7 * i) % 5 - 2) for i in range(rounds * reps)]
        ta, tb = self.time_fn(a), self.time_fn(b)
        return [ta * j for j in jitter], [(ta if self.tie else tb) * j for j in jitter]


def toy_task(shape=None, slug="toy-gpu"):
    return TuningTask("toy.kernel", TOY, {"N_HORIZONS": 5}, shape or {"B": 4096}, "Toy GPU", slug)


def run(tmp_path, evaluator, task=None, **kw):
    task = task or toy_task()
    return tune(task, evaluator, Feasibility(task, toy_static), out=tmp_path, **kw)


def load(tmp_path, task=None):
    task = task or toy_task()
    return json.loads(cache_path(tuning_dir(tmp_path, task.slug), task).read_text())


def by_key(data):
    return {point_key(e["params"]): e for e in data["evaluations"]}


def study_of(tmp_path, task=None):
    task = task or toy_task()
    return optuna.load_study(study_name=task.study_name,
                             storage=open_storage(None, tuning_dir(tmp_path, task.slug)))


def infeasible_points():
    task = toy_task()
    feas = Feasibility(task, toy_static)
    return [p for p in all_points(toy_task()) if feas(p) is not None]


# --- spaces ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kernel", sorted(catalog().specs))
def test_catalog_spaces_render_as_categoricals(kernel):
    spec = catalog()[kernel]
    space = spec.space
    dists = distributions(space)
    assert {k: list(d.choices) for k, d in dists.items()} == {k: list(v) for k, v in
                                                              space.params.items()}
    task = TuningTask.from_spec(spec, spec.suite[0], "G", "g")
    points = all_points(task)
    assert points[0] == dict(space.default)  # valid at the suite's first shape
    assert all(space.violated(p, task.template) is None for p in points)
    valid = {point_key(p) for p in points}
    assert len(valid) == len(points)
    # the walk against every point of the product, or (the pool's millions) a seeded sample
    if math.prod(len(v) for v in space.params.values()) <= 100_000:
        every = [dict(zip(space.params, v)) for v in itertools.product(*space.params.values())]
        assert len(points) == sum(space.violated(p, task.template) is None for p in every)
    else:
        rng = random.Random(0)
        every = [{k: rng.choice(v) for k, v in space.params.items()} for _ in range(100_000)]
        every += points[::97]
    for p in every:
        assert (space.violated(p, task.template) is None) == (point_key(p) in valid), p


def test_dims_labels_round_trip():
    assert dims_label({"K": 256, "B": 4096}) == "B=4096,K=256"
    assert dims_label({}) == "none"
    assert parse_dims(dims_label({"K": 256, "B": 4096})) == {"B": 4096, "K": 256}
    assert parse_dims("B=4096, K=256") == {"B": 4096, "K": 256}
    with pytest.raises(ValueError, match="NAME=INT"):
        parse_dims("B4096")
    with pytest.raises(ValueError, match="integer"):
        parse_dims("B=x")


# --- constraints and validation ---------------------------------------------------------------

@pytest.mark.parametrize("mode", ["tpe", "exhaustive"])
def test_infeasible_points_are_recorded_with_reason_and_never_timed(tmp_path, mode):
    ev = Synthetic()
    # plain TPE: its proposals that break a restriction are trials (a valid-only sampler
    # redraws them instead)
    run(tmp_path, ev, mode=mode, trials=60, seed=1, sampler="tpe")
    bad = infeasible_points()
    assert bad and not [p for p in ev.timed if p in bad]
    data = by_key(load(tmp_path))
    recorded = [e for e in data.values() if e["state"] == "INFEASIBLE"]
    assert recorded and all(e["time_us"] is None and not e["validated"] for e in recorded)
    reasons = {e["reason"] for e in recorded}
    assert ATOMIC in reasons or mode == "tpe"
    assert all(r == ATOMIC or r == "restriction 'BLOCK * ITEMS <= 2048' fails" for r in reasons)
    for t in study_of(tmp_path).trials:
        if t.user_attrs["state"] == "INFEASIBLE":
            assert t.state == optuna.trial.TrialState.PRUNED
            assert t.constraints["infeasible"] == 1.0 and t.user_attrs["reason"] in reasons


def test_sampling_a_point_twice_does_not_time_it_twice(tmp_path):
    ev = Synthetic()
    run(tmp_path, ev, mode="tpe", trials=60, seed=0)
    keys = [point_key(p) for p in ev.timed]
    assert len(keys) == len(set(keys))
    trials = [t for t in study_of(tmp_path).trials  # a redrawn proposal finishes nothing
              if t.state != optuna.trial.TrialState.FAIL]
    assert len(trials) == 60 and len({point_key(t.params) for t in trials}) < 60


def test_failed_validation_is_recorded_and_never_the_best(tmp_path):
    ev = Synthetic()
    out = run(tmp_path, ev, mode="exhaustive")
    data = load(tmp_path)
    evals = by_key(data)
    failed = evals[point_key(FASTEST)]
    assert failed["state"] == "FAILED_VALIDATION" and not failed["validated"]
    assert "numgrad" in failed["reason"] and failed["time_us"] == 10.0
    assert out.best.params == BEST_VALID and data["best"] == {"params": BEST_VALID,
                                                              "time_us": 11.5}
    # validated in time order until one passed: only those two were validated
    assert ev.validated == [FASTEST, BEST_VALID]
    validated = [e for e in evals.values() if e["validated"]]
    assert [e["params"] for e in validated] == [BEST_VALID]
    trial = next(t for t in study_of(tmp_path).trials if t.params == FASTEST)
    assert trial.constraints["validation"] == 1.0 and trial.user_attrs["state"] == \
        "FAILED_VALIDATION"


def test_validation_that_raises_is_a_recorded_failure(tmp_path):
    class Raising(Synthetic):
        def validate(self, params):
            if params == FASTEST:
                raise ValueError("poisoned output element 17 was never written")
            return super().validate(params)

    out = run(tmp_path, Raising(fail=()), mode="exhaustive")
    failed = by_key(load(tmp_path))[point_key(FASTEST)]
    assert failed["state"] == "FAILED_VALIDATION"
    assert failed["reason"].startswith("validation raised ValueError: poisoned")
    assert out.best.params == BEST_VALID


def test_kernel_error_is_recorded_not_raised(tmp_path):
    ev = Synthetic(raise_on=[BEST_VALID])
    out = run(tmp_path, ev, mode="exhaustive")
    err = by_key(load(tmp_path))[point_key(BEST_VALID)]
    assert err["state"] == "ERROR" and "illegal memory access" in err["reason"]
    assert err["time_us"] is None and out.best.params != BEST_VALID
    assert len(ev.timed) == len(all_points(toy_task())) - len(infeasible_points())  # it carried on
    trial = next(t for t in study_of(tmp_path).trials if t.params == BEST_VALID)
    assert trial.state == optuna.trial.TrialState.PRUNED and trial.constraints["error"] == 1.0


def test_an_error_that_breaks_the_evaluator_is_recorded_and_stops_the_run(tmp_path):
    class Poisoning(Synthetic):
        def time(self, params):
            if params == BEST_VALID:
                raise EvaluatorBroken("CUDA context lost: an illegal memory access")
            return super().time(params)

    with pytest.raises(EvaluatorBroken):
        run(tmp_path, Poisoning(), mode="exhaustive")
    assert by_key(load(tmp_path))[point_key(BEST_VALID)]["state"] == "ERROR"
    ev = Synthetic()
    out = run(tmp_path, ev, mode="exhaustive")  # a fresh process resumes past it
    assert BEST_VALID not in ev.timed and out.best.params != BEST_VALID and not out.stopped


# --- search ----------------------------------------------------------------------------------

def test_exhaustive_finds_the_known_optimum_timing_each_point_once(tmp_path):
    ev = Synthetic()
    out = run(tmp_path, ev, mode="exhaustive")
    feasible = [p for p in all_points(toy_task()) if p not in infeasible_points()]
    assert sorted(map(point_key, ev.timed)) == sorted(map(point_key, feasible))
    assert ev.timed[0] == TOY.default  # the baseline first
    valid = [p for p in feasible if p != FASTEST]
    assert out.best.params == min(valid, key=toy_time) == BEST_VALID
    data = load(tmp_path)
    assert data["default_time_us"] == toy_time(TOY.default)
    assert set(data["importance"]) == set(TOY.params)
    assert len(study_of(tmp_path).trials) == len(all_points(toy_task()))
    # re-running is a no-op
    again = Synthetic()
    out2 = run(tmp_path, again, mode="exhaustive")
    assert again.timed == [] and again.validated == [] and out2.trials == 0


def test_tpe_is_seeded_and_reaches_the_optimum(tmp_path):
    a = run(tmp_path / "a", Synthetic(), mode="tpe", trials=60, seed=3)
    b = run(tmp_path / "b", Synthetic(), mode="tpe", trials=60, seed=3)
    assert [t.params for t in study_of(tmp_path / "a").trials] == \
        [t.params for t in study_of(tmp_path / "b").trials]
    assert a.best.params == b.best.params
    assert a.best.time_us <= 1.1 * 11.5
    assert study_of(tmp_path / "a").trials[0].params == TOY.default


def test_cache_file_structure(tmp_path):
    run(tmp_path, Synthetic(), mode="tpe", trials=15)
    data = load(tmp_path)
    assert set(data) == {"kernel", "template", "shape", "gpu", "gpu_slug", "default_params",
                         "default_time_us", "importance", "evaluations", "history", "best",
                         "comparison", "source_hash"}
    assert data["kernel"] == "toy.kernel" and data["gpu_slug"] == "toy-gpu"
    for e in data["evaluations"]:
        assert set(e) == {"params", "state", "time_us", "p20_us", "p80_us", "reason",
                          "validated", "trial_numbers"}
        assert e["state"] in ("COMPLETE", "INFEASIBLE", "FAILED_VALIDATION", "ERROR")
    assert [h["trial"] for h in data["history"]] == list(range(15))
    for h in data["history"]:
        assert set(h) == {"study", "mode", "seed", "trial", "time_us", "best_so_far_us"}
    bests = [h["best_so_far_us"] for h in data["history"] if h["best_so_far_us"] is not None]
    assert bests == sorted(bests, reverse=True)
    assert sorted(n for e in data["evaluations"] for n in e["trial_numbers"]) == list(range(15))


def test_changed_kernel_sources_start_a_fresh_cache(tmp_path):
    run(tmp_path, Synthetic(), mode="tpe", trials=10)
    changed = dataclasses.replace(toy_task(), source_hash="0123456789abcdef")
    ev = Synthetic()
    run(tmp_path, ev, task=changed, mode="tpe", trials=10)
    assert ev.timed  # nothing replayed from the stale record
    assert load(tmp_path, changed)["source_hash"] == "0123456789abcdef"


# --- resume ----------------------------------------------------------------------------------

def test_resume_after_interrupt_in_exhaustive_timing(tmp_path):
    first = Synthetic(interrupt_after=7)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, first, mode="exhaustive")
    assert len(load(tmp_path)["evaluations"]) >= 7  # everything timed before the kill is kept
    second = Synthetic()
    out = run(tmp_path, second, mode="exhaustive")
    done = {point_key(p) for p in first.timed}
    assert not done & {point_key(p) for p in second.timed}
    assert out.best.params == BEST_VALID


def test_resume_after_interrupt_mid_trial_keeps_every_finished_trial(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, Synthetic(interrupt_after=12), mode="tpe", trials=50, seed=2)
    before = {t.number: (t.state, t.params) for t in study_of(tmp_path).trials
              if t.state.is_finished() and t.state != optuna.trial.TrialState.FAIL}
    timed_before = {point_key(e["params"]) for e in load(tmp_path)["evaluations"]
                    if e["time_us"] is not None}
    ev = Synthetic()
    run(tmp_path, ev, mode="tpe", trials=50, seed=2)
    after = {t.number: (t.state, t.params) for t in study_of(tmp_path).trials}
    assert all(after[n] == v for n, v in before.items())
    finished = [t for t in study_of(tmp_path).trials if t.state.is_finished()
                and t.state != optuna.trial.TrialState.FAIL]
    assert len(finished) == 50
    assert not timed_before & {point_key(p) for p in ev.timed}


KILL_SCRIPT = textwrap.dedent("""
    import math, os, signal, sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from test_tuning import Synthetic, run
    kill_at = int(sys.argv[2])

    class Killed(Synthetic):
        def time(self, params):
            with open(sys.argv[3], "a") as log:
                log.write(repr(sorted(params.items())) + "\\n")
            if kill_at and len(self.timed) == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no exception handlers
            return super().time(params)

    run(Path(sys.argv[1]), Killed(), mode="tpe", trials=40, seed=5)
""")


@pytest.mark.installed
def test_resume_after_sigkill_loses_and_redoes_no_finished_trial(tmp_path):
    script = tmp_path / "kill.py"
    script.write_text(KILL_SCRIPT.format(tests=str(Path(__file__).parent)))
    log = tmp_path / "timed.log"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    first = subprocess.run([sys.executable, str(script), str(tmp_path), "9", str(log)], env=env,
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == -signal.SIGKILL, first.stderr
    killed = log.read_text().splitlines()[-1]
    finished = {t.number: t.params for t in study_of(tmp_path).trials if t.state.is_finished()}
    assert len(finished) >= 9
    second = subprocess.run([sys.executable, str(script), str(tmp_path), "0", str(log)], env=env,
                            capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    trials = study_of(tmp_path).trials
    assert all(trials[n].params == p and trials[n].state.is_finished()
               for n, p in finished.items())
    counted = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    assert sum(t.state in counted for t in trials) == 40
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    timings = log.read_text().splitlines()
    # nothing timed to the end before the kill is timed again (only the one it interrupted)
    assert len(set(timings)) == len(timings) or timings.count(killed) == 2
    assert len(set(timings)) >= len(timings) - 1


def test_time_budget_stops_a_sweep_gracefully_and_a_rerun_finishes(tmp_path):
    tasks = [toy_task({"B": 64}), toy_task({"B": 4096})]

    class Slow(Synthetic):
        def time(self, params):
            budget.seconds = 0 if len(self.timed) >= 5 else None  # spend it after 5 timings
            return super().time(params)

    budget = Budget()
    ev = Slow()
    outcomes = run_sweep(tasks, evaluator_for=lambda t: ev,
                         feasibility_for=lambda t: Feasibility(t, toy_static), out=tmp_path,
                         mode="exhaustive", budget=budget)
    assert len(outcomes) == 1 and outcomes[0].stopped and len(ev.timed) == 6
    fresh = {dims_label(t.shape): Synthetic() for t in tasks}
    outcomes = run_sweep(tasks, evaluator_for=lambda t: fresh[dims_label(t.shape)],
                         feasibility_for=lambda t: Feasibility(t, toy_static), out=tmp_path,
                         mode="exhaustive")
    assert [o.stopped for o in outcomes] == [False, False]
    assert not {point_key(p) for p in ev.timed} & {point_key(p) for p in fresh["B=64"].timed}
    runs = json.loads((tuning_dir(tmp_path, "toy-gpu") / RUNS_JSON).read_text())
    assert [r["unfinished"] for r in runs] == [True, False]


def test_a_worker_run_logs_its_run_and_what_it_timed(tmp_path, monkeypatch):
    tasks = [toy_task({"B": 64}), toy_task({"B": 4096})]
    spawned = WorkerRun.new("pycuda-heads sweep --workers 2").spawn_env(1, 2)
    monkeypatch.setenv(RUN_ENV, spawned[RUN_ENV])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    run_ = WorkerRun.current("pycuda-heads sweep --workers 1 --worker-seed 8")
    assert (run_.worker, run_.workers, run_.command) == (1, 2, "pycuda-heads sweep --workers 2")
    evs = {dims_label(t.shape): Synthetic() for t in tasks}
    outcomes = run_sweep(tasks, evaluator_for=lambda t: evs[dims_label(t.shape)],
                         feasibility_for=lambda t: Feasibility(t, toy_static), out=tmp_path,
                         mode="tpe", trials=10, seed=8, run=run_)
    [entry] = json.loads((tuning_dir(tmp_path, "toy-gpu") / RUNS_JSON).read_text())
    assert {k: entry[k] for k in ("run_id", "workers", "worker", "cuda_visible_devices",
                                  "seed", "trials_per_task", "command")} == {
        "run_id": run_.run_id, "workers": 2, "worker": 1, "cuda_visible_devices": "1",
        "seed": 8, "trials_per_task": 10, "command": "pycuda-heads sweep --workers 2"}
    assert entry["timed_points"] == {t.name: [point_key(p) for p in evs[dims_label(t.shape)].timed]
                                     for t in tasks}
    assert entry["timed"] == sum(o.timed for o in outcomes) == \
        sum(map(len, entry["timed_points"].values())) > 0
    monkeypatch.delenv(RUN_ENV)
    run_sweep(tasks, evaluator_for=lambda t: Synthetic(),  # all timed: nothing timed again
              feasibility_for=lambda t: Feasibility(t, toy_static), out=tmp_path, mode="tpe",
              trials=10, run=WorkerRun.current("pycuda-heads sweep"))
    plain = json.loads((tuning_dir(tmp_path, "toy-gpu") / RUNS_JSON).read_text())[1]
    assert (plain["workers"], plain["worker"], plain["timed"], plain["timed_points"]) == \
        (1, 0, 0, {})
    assert plain["run_id"] != run_.run_id


def test_any_optuna_storage_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    assert isinstance(open_storage(url, tmp_path), optuna.storages.RDBStorage)
    out = run(tmp_path, Synthetic(), mode="tpe", trials=12, storage=url)
    study = optuna.load_study(study_name=toy_task().study_name, storage=url)
    assert len(study.trials) == 12 and out.best is not None


# --- export, lookup, fallback ----------------------------------------------------------------

def test_export_then_lookup_round_trip(tmp_path, monkeypatch):
    for shape in ({"B": 64}, {"B": 65536}):
        run(tmp_path, Comparing(time_fn=lambda p, b=shape["B"]: toy_time(p) * b / 64),
            task=toy_task(shape), mode="exhaustive")
    table_dir = tmp_path / "tables"
    path = export(tmp_path, "toy-gpu", table_dir)
    table = json.loads(path.read_text())
    assert table["slug"] == "toy-gpu" and table["gpu"] == "Toy GPU"
    prov = table["provenance"]
    assert {"date", "git_commit", "trials_run", "tuning_wall_s", "validation"} <= set(prov)
    assert prov["trials_run"] == 2 * len(all_points(toy_task()))
    assert prov["validation"]["exported_validated"] == 2
    assert prov["validation"]["configurations_failed"] == 2
    for e in table["entries"]:
        assert e["validated"] and e["params"] == BEST_VALID and not e["kept_default"]
        assert e["default_time_us"] > e["time_us"] > 0 and e["speedup"] > 1
        assert {"kernel", "template", "shape", "params", "time_us", "default_time_us",
                "validated"} <= set(e)
    monkeypatch.setenv("PYCUDA_HEADS_TUNED_DIR", str(table_dir))
    params, source = lookup("toy.kernel", {"N_HORIZONS": 5}, {"B": 65536}, "toy-gpu")
    assert params == BEST_VALID and source == "tuned toy-gpu toy.kernel at B=65536"
    params, source = lookup("toy.kernel", {"N_HORIZONS": 5}, {"B": 100}, "toy-gpu")
    assert params == BEST_VALID and source.endswith("at B=64")  # nearest shape


def test_a_best_not_faster_beyond_noise_keeps_the_default(tmp_path, monkeypatch):
    ev = Comparing(tie=True)
    out = run(tmp_path, ev, mode="exhaustive")
    assert out.best.params == BEST_VALID and ev.compared == [(BEST_VALID, TOY.default)]
    assert TOY.default in ev.validated  # a kept default is validated too
    assert load(tmp_path)["comparison"]["significant"] is False
    [entry] = build_table(tmp_path, "toy-gpu")["entries"]
    assert entry["kept_default"] and entry["params"] == TOY.default and entry["validated"]
    assert entry["best_params"] == BEST_VALID and entry["time_us"] == toy_time(TOY.default)
    export(tmp_path, "toy-gpu", tmp_path / "tables")
    monkeypatch.setenv("PYCUDA_HEADS_TUNED_DIR", str(tmp_path / "tables"))
    params, source = lookup("toy.kernel", {"N_HORIZONS": 5}, {"B": 4096}, "toy-gpu")
    assert params == TOY.default and "default kept" in source


def test_an_evaluator_that_cannot_interleave_exports_the_default(tmp_path):
    run(tmp_path, Synthetic(), mode="exhaustive")
    [entry] = build_table(tmp_path, "toy-gpu")["entries"]
    assert entry["kept_default"] and entry["params"] == TOY.default
    assert entry["why"] == "not compared with the default yet"


def test_lookup_falls_back_to_default(tmp_path, monkeypatch):
    run(tmp_path, Synthetic(), mode="exhaustive")
    export(tmp_path, "toy-gpu", tmp_path / "tables")
    monkeypatch.setenv("PYCUDA_HEADS_TUNED_DIR", str(tmp_path / "tables"))
    assert lookup("other.kernel", {"N_HORIZONS": 5}, {"B": 64}, "toy-gpu") == \
        (None, "default (no tuned other.kernel for {'N_HORIZONS': 5} on toy-gpu)")
    params, source = lookup("toy.kernel", {"N_HORIZONS": 7}, {"B": 64}, "toy-gpu")
    assert params is None and source.startswith("default")
    assert lookup("toy.kernel", {"N_HORIZONS": 5}, {"B": 64}, "no-such-gpu") == \
        (None, "default (no tuned table for no-such-gpu)")


def test_lookup_prefers_the_exact_shape_then_the_nearest_of_one_size(tmp_path, monkeypatch):
    """B=4096,K=64 and B=64,K=4096 have one size: each shape gets its own entry, and a shape
    between them the one nearer axis by axis."""
    entry = {"kernel": "toy.kernel", "template": {"N_HORIZONS": 5}, "validated": True}
    table = {"entries": [{**entry, "shape": {"B": 64, "K": 4096}, "params": {"BLOCK": 512}},
                         {**entry, "shape": {"B": 4096, "K": 64}, "params": {"BLOCK": 128}}]}
    (tmp_path / "toy-gpu.json").write_text(json.dumps(table))
    monkeypatch.setenv("PYCUDA_HEADS_TUNED_DIR", str(tmp_path))
    find = lambda shape: lookup("toy.kernel", {"N_HORIZONS": 5}, shape, "toy-gpu")  # noqa: E731
    assert find({"B": 4096, "K": 64}) == ({"BLOCK": 128}, "tuned toy-gpu toy.kernel at B=4096,K=64")
    assert find({"B": 64, "K": 4096})[0] == {"BLOCK": 512}
    assert find({"B": 2048, "K": 128})[0] == {"BLOCK": 128}


@pytest.mark.parametrize("ci,ships", [([1.01, 1.05], False), ([1.04, 1.08], True), (None, True)])
def test_export_ships_by_p_value_and_interval_whatever_the_stored_verdict(ci, ships):
    """A verdict recorded 'significant' under an older rule with an interval low end of 1.01
    keeps the default; no interval (the default failed) ships the best."""
    from pycuda_heads.tuning.cache import beats_default
    assert beats_default({"p_value": 1e-9, "ci": ci, "significant": True}) is ships
    assert beats_default({"p_value": 0.5, "ci": [1.5, 2.0], "significant": True}) is False


def test_a_schema_created_meanwhile_by_another_worker_is_retried(monkeypatch, tmp_path):
    """PostgreSQL reports tables another worker created a moment earlier as DuplicateTable."""
    from sqlalchemy.exc import ProgrammingError

    from pycuda_heads.tuning import storage
    calls = []

    def racing(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise ProgrammingError("CREATE TABLE studies", {},
                                   Exception('relation "studies" already exists'))
        return "storage"

    monkeypatch.setattr(storage, "RDBStorage", racing)
    assert storage._rdb(f"sqlite:///{tmp_path / 's.db'}", 1, 3) == "storage" and len(calls) == 2


def test_task_without_validated_configuration_is_not_exported(tmp_path):
    everything = [p for p in all_points(toy_task())]
    run(tmp_path, Synthetic(fail=everything), mode="exhaustive")
    table = build_table(tmp_path, "toy-gpu")
    assert table["entries"] == []
    assert table["provenance"]["validation"]["tasks_without_validated_best"] == [
        {"kernel": "toy.kernel", "template": {"N_HORIZONS": 5}, "shape": {"B": 4096}}]


# --- tuner efficiency ------------------------------------------------------------------------

def gate_task(shape):
    return TuningTask.from_spec(catalog()["gate.forward"], shape, "Toy GPU", "toy-gpu")


def gate_time(p):
    return 5 + abs(math.log2(p["BLOCK"] / 256)) + 2 * abs(math.log2(p["ITEMS"] / 2))


def test_efficiency_replay_on_an_exhaustive_cache(tmp_path):
    task = gate_task({"B": 4096})
    tune(task, Synthetic(fail=(), time_fn=gate_time), Feasibility(task), out=tmp_path,
         mode="exhaustive")
    partial = gate_task({"B": 3})  # a tpe cache does not cover the space: skipped
    tune(partial, Synthetic(fail=(), time_fn=gate_time), Feasibility(partial), out=tmp_path,
         mode="tpe", trials=5)
    path = run_efficiency(tmp_path, "toy-gpu", seeds=range(3))
    assert path == tuning_dir(tmp_path, "toy-gpu") / EFFICIENCY_JSON
    [record] = json.loads(path.read_text())
    assert record["kernel"] == "gate.forward" and record["shape"] == {"B": 4096}
    assert record["n_points"] == 20 and record["exhaustive_best_us"] == 5.0
    assert record["exhaustive_best_params"] == {"BLOCK": 256, "ITEMS": 2}
    assert len(record["trials_to_3pct"]) == 3
    assert all(n is not None and 1 <= n <= 40 for n in record["trials_to_3pct"])
    assert record["median_trials_to_3pct"] == sorted(record["trials_to_3pct"])[1]
    # the replay never touches the recorded cache
    assert load(tmp_path, task)["history"][-1]["mode"] == "exhaustive"


# --- command line ----------------------------------------------------------------------------

def parser():
    p = argparse.ArgumentParser()
    cli.register(p.add_subparsers(dest="command", required=True))
    return p


def test_cli_parses_the_documented_commands():
    args = parser().parse_args(["tune", "--kernel", "pool.forward", "--shape", "B=4096,K=256",
                                "--trials", "30", "--mode", "exhaustive", "--seed", "2",
                                "--storage", "postgresql://u@h/db", "--time-budget", "420"])
    assert args.func is cli.cmd_tune and args.trials == 30 and args.time_budget == 420
    args = parser().parse_args(["sweep"])
    assert args.func is cli.cmd_sweep and args.mode == "tpe" and args.storage is None
    assert parser().parse_args(["export"]).func is cli.cmd_export
    assert parser().parse_args(["efficiency"]).func is cli.cmd_efficiency


def test_cli_gpu_commands_fail_cleanly_without_a_gpu(capsys):
    from pycuda_heads.core.device import gpu_available
    if gpu_available():
        pytest.skip("a GPU is present")
    args = parser().parse_args(["tune", "--kernel", "pool.forward", "--shape", "B=2,K=8"])
    assert args.func(args) == 2 and "needs a GPU" in capsys.readouterr().err
    args = parser().parse_args(["sweep", "--kernels", "nope"])
    assert args.func(args) == 2
    for bad, why in (('{"NOPE": 1}', "no kernel of this run has all of its knobs"),
                     ('{"STAGES": 5}', "STAGES=5 is not one of")):
        args = parser().parse_args(["sweep", "--kernels", "pool.forward", "--try", bad])
        assert args.func(args) == 2 and why in capsys.readouterr().err


def test_cli_try_takes_json_objects(capsys):
    args = parser().parse_args(["sweep", "--try", '{"STAGES": 3}', "--try", '{"GRID": 2}'])
    assert args.tries == [{"STAGES": 3}, {"GRID": 2}]
    for bad in ("STAGES=3", "[3]", "{}"):
        with pytest.raises(SystemExit):
            parser().parse_args(["sweep", "--try", bad])
        assert "--try" in capsys.readouterr().err


def test_cli_export_and_efficiency(tmp_path, capsys, monkeypatch):
    def tuned(b: int) -> None:
        task = gate_task({"B": b})
        tune(task, Comparing(fail=(), time_fn=gate_time), Feasibility(task), out=tmp_path,
             mode="exhaustive")

    def export() -> dict:
        args = parser().parse_args(["export", "--out", str(tmp_path)])
        assert args.func(args) == 0
        return json.loads((tmp_path / "toy-gpu" / "toy-gpu.json").read_text())

    tuned(4096)  # one suite shape of three: the kernel ships no entry yet
    table = export()
    assert table["entries"] == []
    assert table["provenance"]["kernels_not_tuned_at_every_suite_shape"] == {
        "gate.forward": [{"B": 3}, {"B": 65536}]}
    tuned(3)
    tuned(65536)
    table = export()
    assert [e["shape"] for e in table["entries"]] == [{"B": 3}, {"B": 4096}, {"B": 65536}]
    assert table["entries"][1]["params"] == {"BLOCK": 256, "ITEMS": 2}
    assert not (tmp_path / "tables").exists()  # installed only when asked
    monkeypatch.setenv("PYCUDA_HEADS_TUNED_DIR", str(tmp_path / "tables"))
    args = parser().parse_args(["export", "--out", str(tmp_path), "--install"])
    assert args.func(args) == 0
    installed = json.loads((tmp_path / "tables" / "toy-gpu.json").read_text())
    for t in (installed, table):  # the two exports may fall in different seconds
        t["provenance"].pop("date")
    assert installed == table
    args = parser().parse_args(["efficiency", "--out", str(tmp_path), "--seeds", "2"])
    assert args.func(args) == 0
    assert len(json.loads((tuning_dir(tmp_path, "toy-gpu") / EFFICIENCY_JSON).read_text())) == 3
    (tmp_path / "empty").mkdir()
    args = parser().parse_args(["export", "--out", str(tmp_path / "empty")])
    assert args.func(args) == 2


def test_gpu_commands_wire_the_gpu_pieces_together(tmp_path, monkeypatch, capsys):
    """`sweep`/`tune` end to end with the GPU parts replaced: feasibility, precompile hook,
    evaluator per task, caches, journal, run log; then `export` of what they wrote."""
    from pycuda_heads.tuning import constraints, objective
    fake = objective.GpuContext("Fake H200", "fake-h200", "sm_90", 227 * 1024)
    compiled = []
    monkeypatch.setattr(objective.GpuContext, "current", classmethod(lambda cls: fake))
    monkeypatch.setattr(objective.GpuContext, "precompile",
                        lambda self, items, workers: compiled.extend(items))
    monkeypatch.setattr(constraints, "spec_static", lambda task, arch: lambda p: None)

    class FakeGpuEvaluator(Comparing):
        def __init__(self, task, reps, warmup):
            super().__init__(fail=(), time_fn=lambda p: 1 + len(str(sorted(p.items()))) % 7)

    monkeypatch.setattr(objective, "GpuEvaluator", FakeGpuEvaluator)
    args = parser().parse_args(["sweep", "--kernels", "gate.forward,gate.backward",
                                "--out", str(tmp_path), "--no-progress", "--jobs", "2"])
    assert args.func(args) == 0
    tdir = tuning_dir(tmp_path, "fake-h200")
    assert len(list(tdir.glob("gate.*__N_HORIZONS=5__B=*.json"))) == 6
    assert (tdir / "optuna.journal").is_file() and (tdir / "runs.json").is_file()
    # TPE (the default mode): each task's startup points, compiled ahead
    assert len(compiled) == 6 * STARTUP_TRIALS
    args = parser().parse_args(["tune", "--kernel", "pool.forward", "--shape", "B=2,K=8",
                                "--trials", "8", "--out", str(tmp_path), "--no-progress"])
    assert args.func(args) == 0
    assert "pool.forward B=2,K=8" in capsys.readouterr().out
    args = parser().parse_args(["export", "--out", str(tmp_path)])
    assert args.func(args) == 0
    table = json.loads((tmp_path / "fake-h200" / "fake-h200.json").read_text())
    # pool.forward, tuned at one of its five suite shapes, ships no entry yet
    assert len(table["entries"]) == 6 and table["gpu"] == "Fake H200"
    assert list(table["provenance"]["kernels_not_tuned_at_every_suite_shape"]) == ["pool.forward"]


def test_gpu_evaluator_rotates_input_sets_and_reports_validation(monkeypatch):
    from pycuda_heads.tuning import objective

    from pycuda_heads.verify import cases, checks

    class Case:
        def __init__(self, seed):
            self.seed, self.floor_bytes, self.launches = seed, 4 << 20, 0

        def launch(self):
            self.launches += 1

        def validate(self):
            return {"passed": False, "failures": ["determinism: run 2 differs", "poison"],
                    "checks": {}}

    made = []

    def make_case(spec, shape, params, template=None, seed=0):
        made.append((spec.id, shape, params, template, seed))
        return Case(seed)

    monkeypatch.setattr(cases, "Case", make_case)
    monkeypatch.setattr(checks, "validate_case", lambda case: case.validate())
    monkeypatch.setattr(objective, "l2_bytes", lambda: 50 << 20)
    alive = [True]
    monkeypatch.setattr(objective, "context_alive", lambda: alive[0])

    def gpu_time_us(fn, reps, warmup):
        for _ in range(warmup + reps):
            fn()
        return {"median_us": 3.0, "p20_us": 2.9, "p80_us": 3.2, "reps": reps}

    monkeypatch.setattr(objective, "gpu_time_us", gpu_time_us)
    task = TuningTask.from_spec(catalog()["gate.forward"], {"B": 4096}, "G", "g")
    ev = objective.GpuEvaluator(task, reps=11, warmup=1)
    assert ev.time({"BLOCK": 64, "ITEMS": 2})["median_us"] == 3.0
    assert [m[4] for m in made] == [0, 1, 2, 3]  # 4 MB inputs: four sets rotate through L2
    assert made[0][:4] == ("gate.forward", {"B": 4096}, {"BLOCK": 64, "ITEMS": 2},
                           {"N_HORIZONS": 5})
    assert ev.validate({"BLOCK": 64, "ITEMS": 2}) == (False, "determinism: run 2 differs; poison")
    assert objective.input_sets(60 << 20) == 1 and objective.input_sets(20 << 20) == 3
    # a fault that poisons the context stops the run instead of failing everything after it
    alive[0] = False
    with pytest.raises(EvaluatorBroken, match="context lost during validation"):
        ev.validate({"BLOCK": 64, "ITEMS": 2})
    monkeypatch.setattr(objective, "gpu_time_us", lambda fn, reps, warmup: 1 / 0)
    with pytest.raises(EvaluatorBroken, match="CUDA context lost: division by zero"):
        ev.time({"BLOCK": 64, "ITEMS": 2})
    alive[0] = True
    with pytest.raises(ZeroDivisionError):  # an ordinary error: recorded by the session
        ev.time({"BLOCK": 64, "ITEMS": 2})


def test_precompile_builds_each_variant_for_its_own_arch(monkeypatch):
    """A WGMMA=1 point compiles for sm_90a, the others for the device's arch."""
    from pycuda_heads.catalog import catalog
    from pycuda_heads.tuning import objective
    spec = catalog()["frdhead.forward"]
    task = TuningTask.from_spec(spec, {"B": 65536}, "G", "g")
    seen = []
    monkeypatch.setattr(objective, "compile_all",
                        lambda sources, workers: seen.extend(arch for _, arch in sources))
    gpu = objective.GpuContext("H200", "h200", "sm_90", 227 * 1024)
    points = [spec.space.complete({"WGMMA": w}, task.template) for w in (0, 1)]
    gpu.precompile([(task, p) for p in points], workers=1)
    assert seen == ["sm_90", "sm_90a"]
