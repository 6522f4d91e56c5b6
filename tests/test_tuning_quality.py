"""CPU: the quality measurement (reference search, the samplers' chains, their exact replay,
the verdict, adoption) on the synthetic evaluator, and the sampler registry on a real space."""
import json
import math
from pathlib import Path

import pytest

optuna = pytest.importorskip(
    "optuna", reason="the tuner needs the tune extra: pip install -e '.[test]'")
from pycuda_heads.tuning import DEFAULT_SAMPLER, quality
from pycuda_heads.tuning.cache import TuningCache
from pycuda_heads.tuning.constraints import Feasibility
from pycuda_heads.tuning.quality import (Chain, Record, adopt, curves, measure,
                                         reference_path, replay_all, replaceable, winner,
                                         write_quality)
from pycuda_heads.tuning.spaces import TuningTask, all_points, point_key, startup_points
from pycuda_heads.tuning.storage import cache_path, tuning_dir
from test_tuning import TOY, Comparing, toy_static, toy_task, toy_time

from pycuda_heads.catalog import catalog
from pycuda_heads.records import QUALITY_JSON, REFERENCE_DIR

optuna.logging.set_verbosity(optuna.logging.WARNING)
SEEDS = (0, 1)
SHIPPED = {"BLOCK": 64, "ITEMS": 8, "VEC": 1}  # a poor point, as a stale table would hold


@pytest.fixture(autouse=True)
def short_budgets(monkeypatch):
    """Chains of 16 trials: the toy space (57 points) is not exhausted by them."""
    monkeypatch.setattr(quality, "BUDGETS", (4, 8, 12, 16))


def task_with_table(shipped=SHIPPED):
    """The toy task with a shipped table point (``TuningTask.shipped`` reads the table)."""
    task = toy_task()
    task.__dict__["shipped"] = dict(shipped)
    return task


def run_measure(tmp_path, evaluator, task=None, **kw):
    task = task or task_with_table()
    record = Record.load(task, reference_path(tmp_path, task))
    kw = {"samplers": ("tpe", "random"), "seeds": SEEDS, "reference_trials": 30, **kw}
    done = measure(task, evaluator, Feasibility(task, toy_static), record, **kw)
    return done, record


def test_measurement_records_every_chain_and_times_a_point_once(tmp_path):
    ev = Comparing(fail=())
    done, record = run_measure(tmp_path, ev)
    assert done
    task = task_with_table()
    # the reference chain and one chain per sampler and seed, each as long as asked
    assert {k: len(v) for k, v in record.chains.items()} == {
        "mixed:0": 30, "tpe:0": 16, "tpe:1": 16, "random:0": 16, "random:1": 16}
    assert len({point_key(p) for p in ev.timed}) == len(ev.timed)  # never timed twice
    # the reference best is the fastest validated configuration the measurement timed
    timed = [e for e in record.evaluations if e.counts]
    assert record.best().time_us == min(e.time_us for e in timed)
    assert record.get(SHIPPED) is not None  # the op's point, timed to mark it on the curves
    # no search is handed the shipped point: the chains start as on a task without a table
    assert startup_points(task, 16, 0, fresh=True) == startup_points(toy_task(), 16, 0)
    assert SHIPPED not in startup_points(task, 16, 0, fresh=True)
    assert SHIPPED in startup_points(task, 16, 0)
    # the verdict: the reference best and the op's point timed interleaved, in this run
    assert ev.compared == [(record.best().params, SHIPPED)]
    assert record.verdict["speedup"] == pytest.approx(toy_time(SHIPPED) / record.best().time_us)
    saved = json.loads(reference_path(tmp_path, task).read_text())
    assert saved["chains"] == record.chains and saved["verdict"] == record.verdict


def test_a_stopped_measurement_resumes_to_exactly_the_uninterrupted_record(tmp_path):
    whole = Comparing(fail=())
    _, one_go = run_measure(tmp_path / "a", whole)
    runs = 0
    while True:  # each run a fresh process's view: only the files carry over
        runs += 1
        ev = Comparing(fail=(), interrupt_after=7)
        try:
            done, record = run_measure(tmp_path / "b", ev)
        except KeyboardInterrupt:
            continue
        if done:
            break
    assert runs > 3
    assert record.chains == one_go.chains
    assert {point_key(e.params): e.time_us for e in record.evaluations} == \
        {point_key(e.params): e.time_us for e in one_go.evaluations}


def test_shorter_chains_measure_the_first_budgets_and_a_longer_run_goes_on(tmp_path):
    """``chain_trials`` below the largest budget: the samplers' chains stop there (the
    reference chain keeps its length) and the task counts as done; a later run with the full
    length extends the same chains, timing only the new points, to the uninterrupted record."""
    short = Comparing(fail=())
    done, record = run_measure(tmp_path / "a", short, chain_trials=8)
    assert done and {k: len(v) for k, v in record.chains.items()} == {
        "mixed:0": 30, "tpe:0": 8, "tpe:1": 8, "random:0": 8, "random:1": 8}
    longer = Comparing(fail=())
    done, record = run_measure(tmp_path / "a", longer)
    _, one_go = run_measure(tmp_path / "b", Comparing(fail=()))
    assert done and record.chains == one_go.chains
    assert not {point_key(p) for p in longer.timed} & {point_key(p) for p in short.timed}


def test_transferring_searches_keep_the_points_they_started_from(tmp_path):
    """A tpe-transfer measurement stores the transferred points it started from in the record;
    once the table (and so ``task.transferred``) changes, its searches still resume and replay
    from the stored points, timing nothing again."""
    first = [p for p in all_points(toy_task())[5:8]]
    task = task_with_table()
    task.__dict__["transferred"] = first
    done, record = run_measure(tmp_path, Comparing(fail=()), task=task,
                               samplers=("tpe-transfer",))
    assert done and record.transferred == first
    assert [json.loads(k) for k in record.chains["tpe-transfer:0"][1:4]] == first
    saved = json.loads(reference_path(tmp_path, task).read_text())
    assert saved["transferred"] == first
    moved = task_with_table()
    moved.__dict__["transferred"] = list(reversed(all_points(toy_task())[20:23]))
    again = Comparing(fail=())
    done, reloaded = run_measure(tmp_path, again, task=moved, samplers=("tpe-transfer",))
    assert done and again.timed == [] and reloaded.chains == record.chains
    entry = curves(moved, reloaded, ["tpe-transfer"], SEEDS, 0.03)
    assert entry["samplers"]["tpe-transfer"]["pending"] == 0


def test_a_small_space_is_timed_whole(tmp_path):
    ev = Comparing(fail=())
    done, record = run_measure(tmp_path, ev, reference_trials=len(all_points(toy_task())))
    assert done and "mixed:0" not in record.chains
    assert all(record.get(p) is not None for p in all_points(toy_task()))


def test_a_chain_that_no_longer_replays_is_named(tmp_path):
    run_measure(tmp_path, Comparing(fail=()))
    path = reference_path(tmp_path, task_with_table())
    data = json.loads(path.read_text())
    data["chains"]["tpe:1"][12] = data["chains"]["tpe:1"][13] + " "
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"chain tpe:1 proposed another point at trial 13"):
        run_measure(tmp_path, Comparing(fail=()))


def test_curves_are_the_chains_best_so_far_against_the_reference(tmp_path):
    _, record = run_measure(tmp_path, Comparing(fail=()))
    task = task_with_table()
    entry = curves(task, record, ["tpe", "random", "tpe-valid"], SEEDS, 0.03)
    best = record.best().time_us
    assert entry["reference"]["time_us"] == best and not entry["exhaustive"]
    assert entry["running"]["percent"] == pytest.approx(100 * best / toy_time(SHIPPED), abs=0.01)
    for name in ("tpe", "random"):  # measured: complete at every budget, nothing pending
        curve = entry["samplers"][name]
        assert curve["complete"] == [len(SEEDS)] * len(quality.BUDGETS) and curve["pending"] == 0
        for seed, row in zip(SEEDS, curve["best_us"]):
            chain = [record.get(json.loads(k)) for k in record.chains[f"{name}:{seed}"]]
            assert row == [min(e.time_us for e in chain[:b] if e.counts)
                           for b in quality.BUDGETS]
            assert row == sorted(row, reverse=True)  # best so far never worsens
        assert curve["within"] == [sum(100 * best / t >= 100 / 1.03 for t in col)
                                   for col in zip(*curve["best_us"])]
    # not measured: censored where its search first meets an untimed point
    assert entry["samplers"]["tpe-valid"]["pending"] >= 0
    assert winner([entry], budget=8) in ("tpe", "random")  # tpe-valid: not measured
    assert winner([entry]) is None  # no budget of 25 here


def test_winner_is_the_sampler_within_most_often_at_25_complete_everywhere():
    def entry(**samplers):
        return {"seeds": [0, 1], "budgets": [12, 25, 50, 100], "samplers": {
            name: {"within": [0, w, 0, 0], "median_percent": [0, m, 0, 0],
                   "complete": [2, c, 2, 2]} for name, (w, m, c) in samplers.items()}}
    assert winner([entry(tpe=(1, 99.0, 2), random=(2, 98.0, 2))]) == "random"
    assert winner([entry(tpe=(2, 99.0, 2), random=(2, 98.0, 2))]) == "tpe"
    assert winner([entry(tpe=(1, 99.0, 2), random=(2, 99.5, 1))]) == "tpe"  # censored
    tuner = DEFAULT_SAMPLER  # a tie keeps the tuner's sampler
    assert winner([entry(**{tuner: (2, 100.0, 2)}, random=(2, 100.0, 2))]) == tuner
    assert winner([entry(random=(2, 100.0, 2), mixed=(2, 100.0, 2))]) == "mixed"
    assert winner([]) is None


def test_replaceable_needs_more_than_within_beyond_noise():
    assert replaceable({"speedup": 1.05, "p_value": 0.001}, 0.03)
    assert not replaceable({"speedup": 1.02, "p_value": 0.001}, 0.03)
    assert not replaceable({"speedup": 1.05, "p_value": 0.2}, 0.03)
    assert not replaceable(None, 0.03)


def test_adopt_puts_the_reference_best_into_the_tuning_cache(tmp_path):
    ev = Comparing(fail=())
    _, record = run_measure(tmp_path, ev)
    task = task_with_table()
    cache = TuningCache.load(task, cache_path(tuning_dir(tmp_path, task.slug), task))
    cache.put(record.get(SHIPPED))  # the cache a short TPE left: the shipped point its best
    said = adopt(task, ev, record, tmp_path)
    assert said.startswith("adopted")
    data = json.loads(cache_path(tuning_dir(tmp_path, task.slug), task).read_text())
    assert data["best"]["params"] == record.best().params
    assert data["comparison"]["params"] == record.best().params  # compared with the default


def test_replay_writes_quality_and_keeps_what_it_holds_unless_asked(tmp_path, monkeypatch):
    """The CPU replay of stored records: quality.json gains missing tasks; an entry it holds
    is never rewritten unless --replace."""
    task = TuningTask.from_spec(catalog()["frdhead.grad_w2"], {"B": 65536}, "Toy GPU", "toy-gpu")
    monkeypatch.setitem(task.__dict__, "shipped", None)
    record = Record.load(task, reference_path(tmp_path, task))
    ev = Comparing(fail=(), time_fn=lambda p: 5 + sum(p.values()) % 7)
    assert measure(task, ev, Feasibility(task), record, samplers=["tpe"], seeds=[0])
    path = replay_all(tmp_path, "toy-gpu", [], ["tpe", "random"], [0], 0.03)
    first = path.read_text()
    quality_data = json.loads(first)
    assert quality_data["scheme"] == quality.SCHEME
    [entry] = quality_data["tasks"]
    assert entry["exhaustive"] and entry["samplers"]["random"]["pending"] == 0
    record.fill({"evaluations": [], "history": [], "verdict": {"speedup": 9.0}})
    replay_all(tmp_path, "toy-gpu", [], ["random"], [0, 1], 0.03)
    assert path.read_text() == first  # held: kept
    replay_all(tmp_path, "toy-gpu", [], ["random"], [0, 1], 0.03, replace=True)
    assert list(json.loads(path.read_text())["tasks"][0]["samplers"]) == ["random"]


def test_a_corrupt_quality_record_is_named(tmp_path):
    path = tuning_dir(tmp_path, "g") / QUALITY_JSON
    path.parent.mkdir(parents=True)
    path.write_text("[]")
    with pytest.raises(ValueError, match=f"search quality record {path}"):
        write_quality(tmp_path, "g", [], replace_all=False)


@pytest.mark.parametrize("name", ["random", "tpe-valid", "mixed", "tpe-local"])
def test_a_valid_only_sampler_spends_no_trial_on_a_point_its_restrictions_refuse(name):
    task = TuningTask.from_spec(catalog()["pool.backward"], {"B": 4096, "K": 256}, "G", "g")
    chain = Chain(task, name, 0, 16)
    chain.advance(lambda p: quality_eval(task, p))
    assert len(chain.points) == 16
    assert all(task.space.violated(p, task.template, task.launch_env) is None
               for p in chain.points)


def test_local_moves_change_one_knob_of_the_best_point_so_far():
    """tpe-local's every other trial after the startup: one knob of the best point so far
    changed, a point not tried yet; the same draw on a replay."""
    from pycuda_heads.tuning.spaces import STARTUP_TRIALS
    task = TuningTask.from_spec(catalog()["pool.backward"], {"B": 4096, "K": 256}, "G", "g")
    chain = Chain(task, "tpe-local", 0, 24)
    chain.advance(lambda p: quality_eval(task, p))
    times = [quality_eval(task, p).time_us for p in chain.points]
    moves = 0
    for i in range(STARTUP_TRIALS + 1, len(chain.points), 2):
        best = chain.points[min(range(i), key=lambda j: times[j])]
        changed = [k for k in best if chain.points[i][k] != best[k]]
        moves += len(changed) == 1
        assert point_key(chain.points[i]) not in {point_key(q) for q in chain.points[:i]}
    assert moves >= 5
    again = Chain(task, "tpe-local", 0, 24)
    again.advance(lambda p: quality_eval(task, p))
    assert again.points == chain.points


def test_tpe_as_the_tuner_runs_it_spends_trials_on_refused_points():
    """Why the valid-only samplers exist: pool.forward's space is 0.3% of its knob product."""
    task = TuningTask.from_spec(catalog()["pool.forward"], {"B": 4096, "K": 256}, "G", "g")
    chain = Chain(task, "tpe", 0, 30)
    chain.advance(lambda p: quality_eval(task, p))
    refused = [p for p in chain.points
               if task.space.violated(p, task.template, task.launch_env) is not None]
    assert len(refused) > 5


def quality_eval(task, p):
    from pycuda_heads.tuning.cache import COMPLETE, INFEASIBLE, Evaluation
    if task.space.violated(p, task.template, task.launch_env) is not None:
        return Evaluation(p, INFEASIBLE, reason="restriction")
    return Evaluation(p, COMPLETE, time_us=100 + 10 * abs(math.log2(p["BLOCK"] / 128))
                      + 5 * p["LAYOUT"] + p["STAGES"], validated=True)  # knobs of both pools


def test_the_shipped_quality_record_chose_the_tuners_sampler():
    """Once the GPU data exists, the sampler the tuner runs is the one its curves chose."""
    for path in Path(__file__).parents[1].glob(f"reports/*/tuning/{QUALITY_JSON}"):
        chosen = json.loads(path.read_text()).get("winner_at_25")
        if chosen is not None:
            assert chosen == DEFAULT_SAMPLER, path


def test_records_live_beside_the_caches_but_are_not_caches(tmp_path):
    task = task_with_table()
    path = reference_path(tmp_path, task)
    assert path.parent == tuning_dir(tmp_path, task.slug) / REFERENCE_DIR
    assert path.name == f"{task.name}.json"
    assert TOY.kernel == task.kernel


def test_measure_command_with_the_gpu_parts_replaced(tmp_path, monkeypatch, capsys):
    """`efficiency --measure` end to end on a fake GPU: a time budget stops it (exit 3), the
    same command resumes; quality.json gets the task; no tuning cache is touched unless
    --adopt, which replaces the op's point where the reference best is more than 3% faster."""
    from pycuda_heads.cli import main
    from pycuda_heads.tuning import constraints, objective
    fake = objective.GpuContext("Fake H200", "fake-h200", "sm_90", 227 * 1024)
    monkeypatch.setattr(objective.GpuContext, "current", classmethod(lambda cls: fake))
    compiled = []
    monkeypatch.setattr(objective.GpuContext, "precompile",
                        lambda self, items, workers: compiled.extend(items))
    monkeypatch.setattr(constraints, "spec_static", lambda task, arch: lambda p: None)
    task = TuningTask.from_spec(catalog()["frdhead.grad_w2"], {"B": 65536}, "Fake H200",
                                "fake-h200")
    baseline = dict(task.baseline)

    class FakeGpuEvaluator(Comparing):
        def __init__(self, task, reps, warmup):
            super().__init__(fail=(), time_fn=lambda p: 20.0 if p == baseline
                             else 5 + sum(p.values()) % 7)

    monkeypatch.setattr(objective, "GpuEvaluator", FakeGpuEvaluator)
    clock = iter(range(1000))
    argv = ["efficiency", "--measure", "--task", "frdhead.grad_w2:B=65536", "--seeds", "2",
            "--out", str(tmp_path), "--no-progress"]
    from pycuda_heads.tuning import progress
    monkeypatch.setattr(progress.Budget, "expired", lambda self: next(clock) > 4)
    assert main(argv + ["--time-budget", "1"]) == 3
    assert "unfinished: frdhead.grad_w2 B=65536" in capsys.readouterr().out
    monkeypatch.setattr(progress.Budget, "expired", lambda self: False)
    assert main(argv) == 0
    tdir = tuning_dir(tmp_path, "fake-h200")
    [entry] = json.loads((tdir / QUALITY_JSON).read_text())["tasks"]
    launchable = [p for p in all_points(task) if Feasibility(task).restriction(p) is None]
    assert entry["exhaustive"] and entry["n_timed"] == len(launchable)
    assert entry["samplers"]["tpe"]["complete"] == [2, 2, 2, 2]
    assert entry["verdict"]["speedup"] > 1.03 and not list(tdir.glob("frdhead*.json"))
    assert compiled  # the points were compiled ahead, in parallel
    assert main(argv + ["--adopt"]) == 0
    assert "adopted" in capsys.readouterr().out
    [cache] = tdir.glob("frdhead*.json")
    data = json.loads(cache.read_text())
    assert data["best"]["params"] == entry["reference"]["params"]
    assert data["comparison"]["default_params"] == baseline


def test_the_exhaustive_replay_is_not_handed_the_shipped_point(monkeypatch):
    """efficiency.json's replay starts as a search without a table would: its first trials
    never include the shipped point (which made the replay circular)."""
    from pycuda_heads.tuning import efficiency, study
    from pycuda_heads.tuning.cache import COMPLETE, Evaluation
    startups = []
    real = study.first_points
    monkeypatch.setattr(study, "first_points",
                        lambda *a: startups.append(real(*a)) or startups[-1])
    task = task_with_table()
    replay = efficiency.Replay([Evaluation(p, COMPLETE, time_us=toy_time(p), p20_us=toy_time(p),
                                           p80_us=toy_time(p), validated=True)
                                for p in all_points(task)])
    efficiency.trials_to_within(task, replay, 0.0, seed=0, max_trials=12)  # never reached
    assert startups and all(SHIPPED not in s for s in startups)
    assert SHIPPED in startup_points(task, 12, 0)  # a tuner's study does start from it
