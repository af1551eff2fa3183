"""Validation trials: the same results on any number of workers; failures reported, not dropped."""

import pytest

from refbayes.parallel import TrialFailure, _demo_trial, run_trials, trial_seed


def test_seeds_come_from_the_key_alone():
    assert trial_seed(("lofi", 3)) == trial_seed(("lofi", 3))
    assert trial_seed(("lofi", 3)) != trial_seed(("lofi", 4))
    assert 0 <= trial_seed("x") < 2**63


def test_in_process_trials_report_failures_in_key_order():
    keys = [0, ("raise", 1), 2]
    out = run_trials(_demo_trial, keys, workers=1)
    assert list(out) == keys
    assert isinstance(out[("raise", 1)], TrialFailure) and "on purpose" in out[("raise", 1)].error
    assert out[0] == _demo_trial(0) and out[2] == _demo_trial(2)
    with pytest.raises(ValueError, match="distinct"):
        run_trials(_demo_trial, [1, 1])


def test_one_and_three_workers_give_identical_tables_and_a_killed_worker_is_reported():
    pytest.importorskip("distributed")
    keys = [("seed", s) for s in range(6)] + [("raise", 0)]
    serial = run_trials(_demo_trial, keys, workers=1)
    parallel = run_trials(_demo_trial, keys + [("die", 0)], workers=3, label="test")
    for key in keys[:-1]:
        assert parallel[key] == serial[key]  # bit for bit: each trial seeds itself from its key
    assert isinstance(parallel[("raise", 0)], TrialFailure)
    dead = parallel[("die", 0)]
    assert isinstance(dead, TrialFailure) and dead.key == ("die", 0)
    assert len(parallel) == len(keys) + 1


def test_trials_on_an_existing_scheduler_match_the_in_process_table():
    """``--scheduler ADDRESS``: the same trials sent to a dask scheduler started elsewhere (here a local
    cluster of two worker processes standing in for a remote one) give the in-process table bit for bit."""
    distributed = pytest.importorskip("distributed")
    keys = [("seed", s) for s in range(4)] + [("raise", 0)]
    serial = run_trials(_demo_trial, keys, workers=1)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        remote = run_trials(_demo_trial, keys, scheduler=cluster.scheduler_address, label="test")
    for key in keys[:-1]:
        assert remote[key] == serial[key]
    assert isinstance(remote[("raise", 0)], TrialFailure)
