"""The smoke training: on the CPU its float64 twin learns from the teacher, the label stream
ends with sentinel rows and the record compares what it should; on the GPU a short run through
the CUDA graph reruns bitwise, is bitwise the eager steps and matches float64."""
import numpy as np
import pytest

from pycuda_heads import smoke

SHORT = smoke.Config(steps=40, batch=64)


def test_the_float64_model_learns_the_teacher():
    losses, params, _ = smoke.train(SHORT, smoke.Kernels(SHORT), SHORT.steps)
    assert np.isfinite(losses).all()
    assert np.mean(losses[-5:]) < 0.7 * losses[0]
    assert np.abs(params["alpha"]).max() > 1e-3  # the gate opened from alpha = 0


def test_a_snapshot_holds_the_parameters_after_that_many_steps():
    cpu = smoke.Kernels(SHORT)
    losses, params, snapshot = smoke.train(SHORT, cpu, 6, snapshot_at=3)
    short_losses, short_params, none = smoke.train(SHORT, cpu, 3)
    assert none is None and losses[:3] == short_losses
    assert {n: v.tobytes() for n, v in snapshot.items()} == \
        {n: v.tobytes() for n, v in short_params.items()}
    assert any(params[n].tobytes() != v.tobytes() for n, v in snapshot.items())


def test_run_compares_two_graph_runs_the_eager_steps_and_float64(monkeypatch):
    """The float64 twin stands in for the GPU: the record's comparisons are of the runs they
    name, and a run whose eager steps differ from the graph's fails."""
    runs = []

    def gpu_train(cfg, steps, graph, snapshot_at=None):
        runs.append(("graph" if graph else "eager", steps, snapshot_at))
        losses, params, snapshot = smoke.train(cfg, smoke.Kernels(cfg), steps, snapshot_at)
        if not graph and tamper:
            params["w1"] = params["w1"] + 1e-7
        return losses, params, snapshot
    monkeypatch.setattr(smoke, "gpu_train", gpu_train)
    cfg = smoke.Config(steps=25, batch=16)
    tamper = False
    result = smoke.run(cfg)
    assert runs == [("graph", 25, smoke.REFERENCE_STEPS), ("graph", 25, smoke.EAGER_STEPS),
                    ("eager", smoke.EAGER_STEPS, None)]
    assert result["bitwise_rerun"] and result["graph_eager_bitwise"]
    assert result["reference_max_rel_err"] == 0 and len(result["eager_losses"]) == 20
    assert set(result["reference_param_rel_err"].values()) == {0.0}
    tamper = True
    assert not smoke.run(cfg)["graph_eager_bitwise"]


def test_the_label_stream_ends_with_sentinel_rows():
    teach = smoke.teacher(SHORT)
    last = smoke.batch(SHORT, teach, SHORT.steps - 1)["labels"]
    first = smoke.batch(SHORT, teach, 0)["labels"]
    assert (first >= 0).all()
    for h in range(SHORT.n_horizons):  # longer horizons are unrealised on more trailing rows
        n = min(SHORT.batch, (h + 1) * SHORT.sentinel_rows)
        assert (last[-n:, h] == -1).all() and (last[:-n, h] >= 0).all()
    np.testing.assert_array_equal(smoke.batch(SHORT, teach, 3)["ln"],
                                  smoke.batch(SHORT, teach, 3)["ln"])  # seeded per step


def test_acceptance_needs_every_field():
    good = {"loss_first": 4.0, "loss_last": 1.0, "nan": False, "bitwise_rerun": True,
            "graph_eager_bitwise": True, "reference_match": True, "alpha_last": [0.1, -0.2]}
    assert smoke.passed(good)
    for bad in ({"loss_last": 2.5}, {"nan": True}, {"bitwise_rerun": False},
                {"graph_eager_bitwise": False}, {"reference_match": False}, {"alpha_last": [0.0, 0.0]}):
        assert not smoke.passed({**good, **bad})


@pytest.mark.gpu
def test_a_short_gpu_run_reruns_bitwise_is_the_eager_run_and_matches_float64():
    result = smoke.run(smoke.Config(steps=22))
    assert not result["nan"] and result["bitwise_rerun"], result
    assert result["graph_eager_bitwise"], (result["graph_losses_first"], result["eager_losses"])
    assert result["reference_match"], result["reference_max_rel_err"]
    assert len(result["losses"]) == 22 and result["eager_steps"] == 20
