"""Random ``fit`` jobs (random_fit_program.py): plain ``model.fit`` and ``tfaccel.fit`` train the same model, report
the same history and write the same callback files, whatever combination of arguments, data form, model shape,
callbacks and compile options a job draws; on one device, and under ``mirrored`` over 2 virtual CPUs against Keras'
own fit under a MirroredStrategy (on one device where Keras clips per replica: the program's reference_strategy).

The parity suite's cases each check one feature; combinations are where tfaccel's own loops went wrong unseen:
the first 40 random jobs found ``steps_per_epoch`` and ``validation_steps`` ignored by the compiled loop,
``steps_per_execution="auto"`` running Keras' fit past them, and a multi-output model's per-output losses averaged
otherwise than by fit (2026-11-30; each fixed with a test of its own). The seeds are fixed so that a failure
reproduces; ``TFACCEL_RANDOM_FIT="SEED COUNT"`` (one device) and ``TFACCEL_RANDOM_FIT_MIRRORED="SEED COUNT"`` run
other jobs (e.g. ``"7 200"``).
"""

import json
import os
from pathlib import Path

import pytest

import harness

PROGRAM = Path(__file__).resolve().parent / "random_fit_program.py"
RUNS = {"default": (os.environ.get("TFACCEL_RANDOM_FIT", "0 32"), {"compiled", "keras_fit"}),
        "mirrored": (os.environ.get("TFACCEL_RANDOM_FIT_MIRRORED", "0 16"), {"multi_step", "keras_fit"})}


@pytest.mark.parametrize("strategy", sorted(RUNS))
def test_random_fit_jobs_train_what_plain_fit_trains(strategy: str) -> None:
    jobs, loops_expected = RUNS[strategy]
    seed, count = jobs.split()
    (result,) = harness.run_tasks(PROGRAM, tasks=[("worker", 0, None)], args=[seed, count, strategy], timeout=900)
    harness.assert_all_ok([result])
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == int(count), result.stdout[-3000:] + result.stderr[-3000:]
    differing = [line for line in lines if line["differences"]]
    assert not differing, "\n".join(json.dumps(line) for line in differing)
    loops = {line["loop"] for line in lines}
    assert loops_expected <= loops, loops  # both of tfaccel's loops for that strategy were drawn
