"""Preemption (issue 25): SIGTERM to one worker of `tfaccel launch --workers 2 --max-restarts 0` at a random step.

scripts/reliability.py --preempt N runs the same trial N times (and --preempt_horovod, --preempt_ps) and prints
the tally; here: one trial (seeded), against the uninterrupted reference of test_reliability_processes.
"""

import random

import pytest

import rel_preempt
import rel_scenarios as rs


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    result = rs.r1_reference(tmp_path_factory.mktemp("preempt-reference"))
    assert result["ok"], result["why"]
    return result


@pytest.mark.slow
def test_sigterm_to_one_worker_every_worker_exits_preempted_restart_loses_no_step(reference, tmp_path):
    result = rel_preempt.preempt_trial(tmp_path, reference["weights"], rng=random.Random(2511))
    assert result["ok"], f"{result['why']}\nmeasured: { {k: v for k, v in result.items() if k != 'why'} }"
    assert result["steps_lost"] == 0 and result["max_abs_diff"] <= 1e-6
    assert result["max_exit_s"] <= rel_preempt.GRACE_S
    assert result["restarts_reported"][-1]["why"] == "preemption"
