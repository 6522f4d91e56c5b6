"""The smoke training: on the CPU its float64 twin learns from the teacher and the label stream
ends with sentinel rows; on the GPU a short run reruns bitwise and matches float64."""
import numpy as np
import pytest

from pycuda_heads import smoke

SHORT = smoke.Config(steps=40, batch=64)


def test_the_float64_model_learns_the_teacher():
    losses, params, _ = smoke.train(SHORT, smoke.Kernels(SHORT, gpu=False), SHORT.steps)
    assert np.isfinite(losses).all()
    assert np.mean(losses[-5:]) < 0.7 * losses[0]
    assert np.abs(params["alpha"]).max() > 1e-3  # the gate opened from alpha = 0


def test_a_snapshot_holds_the_parameters_after_that_many_steps():
    cpu = smoke.Kernels(SHORT, gpu=False)
    losses, params, snapshot = smoke.train(SHORT, cpu, 6, snapshot_at=3)
    short_losses, short_params, none = smoke.train(SHORT, cpu, 3)
    assert none is None and losses[:3] == short_losses
    assert {n: v.tobytes() for n, v in snapshot.items()} == \
        {n: v.tobytes() for n, v in short_params.items()}
    assert any(params[n].tobytes() != v.tobytes() for n, v in snapshot.items())


def test_run_trains_twice_on_the_gpu_side(monkeypatch):
    """The record's parameters after the reference steps come from the first run, not a third."""
    runs = []
    real_train, real_kernels = smoke.train, smoke.Kernels

    def kernels(cfg, gpu):  # the float64 twin stands in for the GPU side
        k = real_kernels(cfg, gpu=False)
        k.gpu = gpu
        return k

    def train(cfg, k, steps, snapshot_at=None):
        runs.append(("gpu" if k.gpu else "float64", steps))
        return real_train(cfg, k, steps, snapshot_at)
    monkeypatch.setattr(smoke, "Kernels", kernels)
    monkeypatch.setattr(smoke, "train", train)
    cfg = smoke.Config(steps=5, batch=16)
    result = smoke.run(cfg)
    assert runs == [("gpu", 5), ("gpu", 5), ("float64", smoke.REFERENCE_STEPS)]
    assert result["bitwise_rerun"] and result["reference_max_rel_err"] == 0
    assert set(result["reference_param_rel_err"].values()) == {0.0}


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
            "reference_match": True, "alpha_last": [0.1, -0.2]}
    assert smoke.passed(good)
    for bad in ({"loss_last": 2.5}, {"nan": True}, {"bitwise_rerun": False},
                {"reference_match": False}, {"alpha_last": [0.0, 0.0]}):
        assert not smoke.passed({**good, **bad})


@pytest.mark.gpu
def test_a_short_gpu_run_reruns_bitwise_and_matches_float64():
    result = smoke.run(smoke.Config(steps=12))
    assert not result["nan"] and result["bitwise_rerun"], result
    assert result["reference_match"], result["reference_max_rel_err"]
    assert len(result["losses"]) == 12 and result["steps"] == 12
