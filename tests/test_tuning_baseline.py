"""CPU: the tuner's baseline is the point the op runs without a tuned entry, the space's
default or, where it cannot run (a wide template, a small shared memory), its nearest valid
point. It is timed, every tuned configuration is compared with it, and a verdict reached
against another point is reached again."""
import json
import signal

import pytest

optuna = pytest.importorskip(
    "optuna", reason="the tuner needs the tune extra: pip install -e '.[test]'")
from pycuda_heads.tuning.cache import TuningCache
from pycuda_heads.tuning.export import build_table
from pycuda_heads.tuning.spaces import TuningTask, all_points, suggest
from pycuda_heads.tuning.storage import cache_path, open_storage, tuning_dir
from pycuda_heads.tuning.tune import compare_with_default, tune
from test_tuning import (
    BEST_VALID,
    TOY,
    Comparing,
    Feasibility,
    Synthetic,
    load,
    run,
    study_of,
    toy_task,
)

from pycuda_heads.catalog import catalog
from pycuda_heads.core import op as op_module
from pycuda_heads.core.space import SM90_MAX_SHARED_BYTES
from pycuda_heads.ops.pool import PerHorizonAttentionPool

COUNTED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
# the default's LAYOUT 2 rows (GROUP 16, MIN_BLOCKS 3) do not fit the registers here
WIDE = {"N_HORIZONS": 2, "HIDDEN_DIM": 1024}
WIDE_SHAPE = {"B": 256, "K": 64}
# LAYOUT 1 reads none of these (WGMMA is 1 at LAYOUT 6 only)
_PINNED = {"WGMMA": 0, "GROUP": 32, "TEAMS": 1, "GRID": 0, "MIN_BLOCKS": 0, "STAGES": 4,
           "GROUP_KEYS": 1, "CHUNK": 4096}
NEAREST = {"BLOCK": 128, "VEC": 4, "UNROLL": 1, "LAYOUT": 2, **_PINNED, "TEAMS": 4}
FAST = {"BLOCK": 64, "VEC": 4, "UNROLL": 1, "LAYOUT": 1, **_PINNED}


def wide_task(**kw):
    return TuningTask.from_spec(catalog()["pool.backward"], WIDE_SHAPE, "Toy GPU", "toy-gpu",
                                WIDE, **kw)


def nearest_fastest(p):
    """The baseline fastest (10 us); every other point slower by its knobs that differ."""
    return 10.0 + sum(p[k] != NEAREST[k] for k in p)


def fast_elsewhere(p):
    return 5.0 if p == FAST else nearest_fastest(p)


def op_choice(template, shape, max_shared, monkeypatch):
    """The launch parameters the pool op picks for its backward without a tuned entry (no GPU:
    the op's state as its constructor leaves it)."""
    monkeypatch.setattr(op_module, "lookup", lambda *a: (None, "default (no tuned table)"))
    inst = object.__new__(PerHorizonAttentionPool)
    inst.template, inst._user, inst._resolved, inst.chosen = dict(template), {}, {}, {}
    inst._slug, inst._max_shared = "toy-gpu", max_shared
    return inst.launch_params("backward", shape)


@pytest.mark.parametrize("template,shape,max_shared", [
    (WIDE, WIDE_SHAPE, SM90_MAX_SHARED_BYTES),  # restrictions rule the default out
    ({"N_HORIZONS": 5, "HIDDEN_DIM": 128}, {"B": 64, "K": 4096}, 48 * 1024),  # shared memory
    ({"N_HORIZONS": 5, "HIDDEN_DIM": 128}, {"B": 64, "K": 4096}, SM90_MAX_SHARED_BYTES),
])
def test_the_baseline_is_the_point_the_op_runs_untuned(template, shape, max_shared,
                                                       monkeypatch):
    spec = catalog()["pool.backward"]
    space = spec.space
    task = TuningTask.from_spec(spec, shape, "G", "g", template, max_shared_bytes=max_shared)
    env = {**shape, "MAX_SHARED_BYTES": max_shared}
    assert task.baseline == space.nearest(space.default, task.template, env) == \
        op_choice(task.template, shape, max_shared, monkeypatch)
    assert all_points(task)[0] == task.baseline
    valid = space.violated(space.default, task.template, env) is None
    assert (task.baseline == dict(space.default)) is valid
    # the tuner's feasibility judges at the same limit: the baseline may be timed
    assert Feasibility(task)(task.baseline) is None


def test_wide_template_baseline_is_the_nearest_valid_point():
    task = wide_task()
    assert dict(task.space.default) != task.baseline == NEAREST
    assert Feasibility(task)(dict(task.space.default)) is not None  # the literal default


@pytest.mark.parametrize("mode", ["tpe", "exhaustive"])
def test_the_tuner_times_and_compares_with_the_baseline(tmp_path, mode):
    task = wide_task()
    ev = Comparing(fail=(), time_fn=fast_elsewhere)
    out = tune(task, ev, Feasibility(task), out=tmp_path, mode=mode, trials=8, seed=0)
    assert ev.timed[0] == NEAREST  # queued (tpe) or timed (exhaustive) first
    if mode == "tpe":
        assert study_of(tmp_path, task).trials[0].params == NEAREST
    assert out.default.params == NEAREST and out.default.time_us == 10.0
    data = load(tmp_path, task)
    assert data["default_params"] == NEAREST and data["default_time_us"] == 10.0
    if out.best.params == FAST:  # tpe may not sample it in 8 trials
        assert ev.compared == [(FAST, NEAREST)]
        assert data["comparison"]["params"] == FAST and data["comparison"]["speedup"] > 1.9
    assert data["comparison"]["default_params"] == NEAREST
    [entry] = build_table(tmp_path, "toy-gpu", suite=lambda kernel: None)["entries"]
    assert entry["default_time_us"] == 10.0
    assert entry["params"] == (NEAREST if entry["kept_default"] else FAST)


def test_a_study_finished_against_another_default_times_the_baseline_and_decides_again(
        tmp_path, monkeypatch):
    """The H200 sweep's wide pool tasks: the old tuner compared with the literal default,
    which cannot run, so any validated configuration shipped, slower than what runs untuned."""
    with monkeypatch.context() as m:  # the tuner before the baseline was the nearest point
        m.setattr(TuningTask, "baseline", property(lambda self: dict(self.space.default)))
        tune(wide_task(), Comparing(fail=(), time_fn=nearest_fastest), Feasibility(wide_task()),
             out=tmp_path, mode="tpe", trials=6, seed=0)
    task = wide_task()
    path = cache_path(tuning_dir(tmp_path, "toy-gpu"), task)
    old = json.loads(path.read_text())
    del old["comparison"]["default_params"]  # as an older tuner wrote it
    path.write_text(json.dumps(old))
    assert old["default_time_us"] is None and "INFEASIBLE" in old["comparison"]["note"]
    assert NEAREST not in [t.params for t in study_of(tmp_path, task).trials]
    [shipped] = build_table(tmp_path, "toy-gpu", suite=lambda kernel: None)["entries"]
    assert not shipped["kept_default"] and shipped["time_us"] > 10.0  # slower than untuned

    ev = Comparing(fail=(), time_fn=nearest_fastest)
    out = tune(task, ev, Feasibility(task), out=tmp_path, mode="tpe", trials=6, seed=0)
    assert out.trials == 1 and ev.timed == [NEAREST] and NEAREST in ev.validated
    finished = [t for t in study_of(tmp_path, task).trials if t.state in COUNTED]
    assert len(finished) == 7 and finished[-1].params == NEAREST
    data = load(tmp_path, task)
    assert data["default_params"] == NEAREST and data["default_time_us"] == 10.0
    assert data["comparison"]["params"] == data["comparison"]["default_params"] == NEAREST
    [entry] = build_table(tmp_path, "toy-gpu", suite=lambda kernel: None)["entries"]
    assert entry["kept_default"] and entry["params"] == NEAREST
    assert entry["time_us"] == entry["default_time_us"] == 10.0
    assert entry["why"] == "the default is the best"
    # done: a further run times nothing and runs no trial
    again = Comparing(fail=(), time_fn=nearest_fastest)
    out = tune(task, again, Feasibility(task), out=tmp_path, mode="tpe", trials=6, seed=0)
    assert out.trials == 0 and again.timed == [] and again.compared == []


def test_a_verdict_is_reused_only_against_the_same_baseline(tmp_path):
    task = toy_task()
    run(tmp_path, Comparing(), mode="exhaustive")
    path = cache_path(tuning_dir(tmp_path, task.slug), task)
    data = json.loads(path.read_text())
    assert data["comparison"]["default_params"] == TOY.default

    def compared(comparison):
        path.write_text(json.dumps({**data, "comparison": comparison}))
        cache = TuningCache.load(task, path)
        ev = Comparing()
        compare_with_default(task, ev, cache)
        return ev.compared, cache.comparison

    assert compared(data["comparison"]) == ([], data["comparison"])
    keyless = {k: v for k, v in data["comparison"].items() if k != "default_params"}
    # an older tuner's verdict was reached against the space's default: here the baseline
    assert compared(keyless) == ([], data["comparison"])
    other = {**data["comparison"], "default_params": {"BLOCK": 64, "ITEMS": 1, "VEC": 1}}
    calls, comparison = compared(other)
    assert calls == [(BEST_VALID, TOY.default)] and comparison["default_params"] == TOY.default


@pytest.mark.parametrize("default_params,ships", [
    (None, True),  # an older tuner's verdict: against the default written beside it
    (TOY.default, True),
    ({"BLOCK": 64, "ITEMS": 1, "VEC": 1}, False),
])
def test_export_ships_only_a_verdict_against_the_cache_default(tmp_path, default_params,
                                                               ships):
    task = toy_task()
    run(tmp_path, Comparing(), mode="exhaustive")
    path = cache_path(tuning_dir(tmp_path, task.slug), task)
    data = json.loads(path.read_text())
    data["comparison"].pop("default_params")
    if default_params is not None:
        data["comparison"]["default_params"] = default_params
    path.write_text(json.dumps(data))
    [entry] = build_table(tmp_path, "toy-gpu")["entries"]
    assert entry["kept_default"] is not ships
    assert entry["params"] == (BEST_VALID if ships else TOY.default)
    if not ships:
        assert entry["why"] == "not compared with the default yet" and entry["speedup"] is None


def test_a_baseline_queued_again_by_fail_stale_is_not_queued_twice(tmp_path):
    """A worker died while timing the baseline: its trial is failed and the baseline queued
    again, once."""
    task = toy_task()
    study = optuna.create_study(study_name=task.study_name, direction="minimize",
                                storage=open_storage(None, tuning_dir(tmp_path, task.slug)))
    study.enqueue_trial(task.baseline)
    suggest(study.ask(), task.space)  # RUNNING, never claimed: its worker is gone
    run(tmp_path, Synthetic(), mode="tpe", trials=5)
    trials = study_of(tmp_path).trials
    on_baseline = [t for t in trials if t.params == task.baseline
                   and t.state != optuna.trial.TrialState.FAIL]
    assert len(on_baseline) == 1 and trials[0].state == optuna.trial.TrialState.FAIL
    assert sum(t.state in COUNTED for t in trials) == 5


def test_a_tpe_study_starts_with_the_points_a_sweep_compiles_ahead(tmp_path):
    """The baseline and seeded random valid points, the same in every process, are the first
    trials; a resumed study does not queue them again."""
    from pycuda_heads.tuning.spaces import STARTUP_TRIALS, startup_points
    task = wide_task()
    startup = startup_points(task, trials=12, seed=0)
    assert startup == startup_points(task, trials=12, seed=0) != startup_points(task, 12, 1)
    assert len(startup) == STARTUP_TRIALS and startup[0] == NEAREST
    assert len({json.dumps(p, sort_keys=True) for p in startup}) == STARTUP_TRIALS
    assert all(task.space.violated(p, task.template, task.launch_env) is None for p in startup)
    assert startup_points(task, trials=3, seed=0) == startup[:3]
    ev = Comparing(fail=(), time_fn=nearest_fastest)
    # a valid-only sampler's redrawn proposals are FAIL trials that finish nothing
    finished = lambda: [t for t in study_of(tmp_path, task).trials  # noqa: E731
                        if t.state != optuna.trial.TrialState.FAIL]
    tune(task, ev, Feasibility(task), out=tmp_path, mode="tpe", trials=6, seed=0)
    assert [t.params for t in finished()] == startup[:6]
    tune(task, ev, Feasibility(task), out=tmp_path, mode="tpe", trials=12, seed=0)
    trials = finished()
    assert [t.params for t in trials][:STARTUP_TRIALS] == startup and len(trials) == 12
    assert all(t.state in COUNTED for t in trials)


def test_a_fresh_study_tries_every_layout_before_tpe_models_them():
    """At H=32, D=128 the pool has five layouts' points, LAYOUT 4's few among thousands: a study
    handed no tries and no shipped point still times each layout the shape can run within its
    startup trials, the tensor-core layout included."""
    from pycuda_heads.tuning.spaces import STARTUP_TRIALS, startup_points
    for kernel in ("pool.forward", "pool.backward"):
        task = TuningTask.from_spec(catalog()[kernel], {"B": 512, "K": 64}, "Toy GPU", "toy-gpu",
                                    template={"N_HORIZONS": 32, "HIDDEN_DIM": 128})
        startup = startup_points(task, trials=30, seed=0, fresh=True)
        runs = {p["LAYOUT"] for p in task.space.points(task.template, task.shape)}
        assert len(startup) == STARTUP_TRIALS and {p["LAYOUT"] for p in startup} == runs
        assert 4 in runs


def test_a_retune_starts_from_the_shipped_point(monkeypatch):
    """The shipped table's entry for the task, whatever sources it was tuned on, is the second
    startup trial, completed for knobs the space gained since; an entry that can no longer run
    there, or that names another shape, is left out."""
    from pycuda_heads.tuning import spaces
    spec = catalog()["pool.forward"]
    shape = {"B": 64, "K": 4096}
    old = {"BLOCK": 512, "VEC": 2, "UNROLL": 4, "LAYOUT": 0}  # tuned before LAYOUT 2's knobs
    entries = [{"kernel": "pool.forward", "shape": {"B": 2, "K": 8}, "params": dict(FAST),
                "template": {"N_HORIZONS": 5, "HIDDEN_DIM": 128}},
               {"kernel": "pool.forward", "shape": shape, "params": old,
                "template": {"N_HORIZONS": 5, "HIDDEN_DIM": 128}}]
    monkeypatch.setattr(spaces, "load_table", lambda slug: {"entries": entries})
    task = TuningTask.from_spec(spec, shape, "Toy GPU", "toy-gpu")
    startup = spaces.startup_points(task, trials=12, seed=0)
    assert startup[0] == task.baseline
    assert startup[1] == {**old, **_PINNED, "QREG": 0, "SMEM_SCORES": 0, "LANE_ACC": 0}
    assert len({json.dumps(p, sort_keys=True) for p in startup}) == len(startup)

    entries[1]["params"] = {**old, "VEC": 3}  # no longer a value of the space
    stale = TuningTask.from_spec(spec, shape, "Toy GPU", "toy-gpu")
    assert stale.shipped is None
    monkeypatch.setattr(spaces, "load_table", lambda slug: None)
    unshipped = TuningTask.from_spec(spec, shape, "Toy GPU", "toy-gpu")
    assert spaces.startup_points(stale, 12, 0) == spaces.startup_points(unshipped, 12, 0)


def test_startup_draws_every_layout_before_repeating_knob_values():
    """pool.forward has few LAYOUT 0 and 1 points among many of LAYOUT 2: TPE's random start
    still tries each layout."""
    from pycuda_heads.tuning.spaces import STARTUP_TRIALS, startup_points
    task = TuningTask.from_spec(catalog()["pool.forward"], {"B": 256, "K": 64}, "Toy GPU", "toy-gpu")
    for seed in range(5):
        startup = startup_points(task, trials=STARTUP_TRIALS, seed=seed)
        assert {p["LAYOUT"] for p in startup} == {0, 1, 2}
        assert {p["GROUP"] for p in startup} == {8, 16, 32}
        assert startup_points(task, trials=4, seed=seed) == startup[:4]


def test_tries_follow_the_shipped_point_where_their_knobs_and_values_fit(monkeypatch):
    """``--try`` points are completed from the default and queued after the baseline and the
    shipped point, even past the random startup trials; a try naming a knob the space lacks,
    or invalid at the template, is left out of that study; a value the space lacks is an
    error."""
    from pycuda_heads.tuning import spaces
    monkeypatch.setattr(spaces, "load_table", lambda slug: None)
    spec = catalog()["pool.forward"]
    stages = [{"STAGES": s} for s in (2, 3, 6, 8)]
    tries = (*stages, {"SMEM_SCORES": 1, "GROUP_KEYS": 2, "STAGES": 3}, {"STAGES": 3},
             {"LAYOUT": 3, "BLOCK": 256, "CHUNK": 8192},  # needs N_HORIZONS % 4 == 0
             {"TK": 2}, *({"GRID": g} for g in (1, 2, 3, 4)), {"MIN_BLOCKS": 2})
    task = TuningTask.from_spec(spec, {"B": 4096, "K": 64}, "Toy GPU", "toy-gpu", tries=tries)
    want = [{**spec.space.default, **t} for t in (*stages, tries[4], *tries[-5:])]
    assert task.tried == want
    startup = spaces.startup_points(task, trials=30, seed=0)
    assert startup[0] == task.baseline and startup[1:1 + len(want)] == want
    assert len(startup) == 1 + len(want) > spaces.STARTUP_TRIALS
    assert spaces.startup_points(task, trials=4, seed=0) == startup[:4]

    wide = TuningTask.from_spec(spec, {"B": 512, "K": 64}, "Toy GPU", "toy-gpu",
                                {"N_HORIZONS": 32, "HIDDEN_DIM": 128}, tries=tries)
    # at H=32 the STAGES tries of 2 and 3 find LAYOUT 5 (the one layout there that reads
    # STAGES), 6 and 8 nothing; the LAYOUT 3 try follows them
    assert [t["LAYOUT"] for t in wide.tried[:2]] == [5, 5]
    assert [t["STAGES"] for t in wide.tried[:2]] == [2, 3]
    assert {"LAYOUT": 3, "BLOCK": 256, "CHUNK": 8192}.items() <= wide.tried[2].items()
    with pytest.raises(ValueError, match="STAGES=5"):
        TuningTask.from_spec(spec, {"B": 64, "K": 64}, "G", "g", tries=({"STAGES": 5},)).tried


def test_transfer_leads_the_startup_with_the_kernels_entries_at_other_shapes(monkeypatch):
    """``tpe-transfer``'s startup: the baseline, then the kernel's entries at its other shapes
    and templates, nearest shape first, each once and valid here (completed for knobs added
    since); never the task's own entry, also in a fresh search (a measurement); other
    samplers' startups are unchanged."""
    from pycuda_heads.tuning import spaces
    from pycuda_heads.tuning.samplers import first_points
    spec = catalog()["pool.forward"]
    shape = {"B": 4096, "K": 256}
    template = {"N_HORIZONS": 5, "HIDDEN_DIM": 128}
    near = {"BLOCK": 512, "VEC": 2, "UNROLL": 4, "LAYOUT": 0}
    far = {"BLOCK": 128, "VEC": 4, "UNROLL": 1, "LAYOUT": 0}
    own = {"BLOCK": 256, "VEC": 4, "UNROLL": 1, "LAYOUT": 0}
    entries = [{"kernel": "pool.forward", "shape": {"B": 2, "K": 8}, "params": far,
                "template": template},
               {"kernel": "pool.forward", "shape": {"B": 4096, "K": 64}, "params": near,
                "template": template},
               {"kernel": "pool.forward", "shape": {"B": 1024, "K": 128}, "params": near,
                "template": template},
               {"kernel": "pool.backward", "shape": shape, "params": far, "template": template},
               {"kernel": "pool.forward", "shape": shape, "params": own, "template": template},
               {"kernel": "pool.forward", "shape": {"B": 4096, "K": 128},
                "params": {**far, "VEC": 3}, "template": template}]  # VEC 3: no value here
    monkeypatch.setattr(spaces, "load_table", lambda slug: {"entries": entries})
    task = TuningTask.from_spec(spec, shape, "Toy GPU", "toy-gpu")
    complete = lambda p: spec.space.complete(p, task.template)  # noqa: E731
    assert task.transferred == [complete(near), complete(far)]
    startup = first_points(task, "tpe-transfer", trials=12, seed=0, fresh=True)
    assert startup[:3] == [task.baseline, complete(near), complete(far)]
    assert complete(own) not in startup and len(startup) == spaces.STARTUP_TRIALS
    assert first_points(task, "tpe-valid", 12, 0, fresh=True) == \
        spaces.startup_points(task, 12, 0, fresh=True)
    assert first_points(task, "random", 12, 0) == [task.baseline]


@pytest.mark.parametrize("sampler", ["tpe-valid", "tpe-transfer"])
def test_a_valid_only_sampler_records_a_queued_point_that_cannot_run(tmp_path, monkeypatch,
                                                                    sampler):
    """A queued baseline that breaks a restriction is the caller's point, not a proposal to
    redraw: it is recorded infeasible and the search ends (it was queued again forever)."""
    def stuck(*_):
        raise TimeoutError("the search did not end")
    monkeypatch.setattr(TuningTask, "baseline", property(lambda self: dict(self.space.default)))
    previous = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(60)
    try:
        tune(wide_task(), Comparing(fail=(), time_fn=nearest_fastest), Feasibility(wide_task()),
             out=tmp_path, mode="tpe", trials=4, seed=0, sampler=sampler)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    data = load(tmp_path, wide_task())
    assert data["default_time_us"] is None and "INFEASIBLE" in data["comparison"]["note"]
