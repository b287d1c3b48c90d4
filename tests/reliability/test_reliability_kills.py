"""Real kills during saves (issues 24, 35): a process SIGKILLed while it writes backups restarts cleanly.

The backups are written in a background thread while training goes on (asynchronous by default), so the kills land
during asynchronous writes. scripts/reliability.py --kills N runs the same trial N times and prints the tally; here:
two trials (seeded).
"""

import random

import pytest

import rel_kills


@pytest.mark.slow
def test_sigkill_while_writing_backups_then_restart_resumes_from_a_complete_backup(tmp_path):
    ref = rel_kills.reference(tmp_path / "reference")
    assert ref["ok"], ref["why"]
    assert ref["backups_written"] == 30  # 3 epochs x 10 steps, a backup after each
    # written in the background; each backup came due while the previous one was still being written, and waited
    assert ref["backup_writer"]["mode"] == "async" and ref["backup_writer"]["waited"] > 0, ref["backup_writer"]
    rng = random.Random(24)
    results = [rel_kills.trial(tmp_path / f"trial-{i}", ref, rng=rng) for i in range(2)]
    for result in results:
        assert result["ok"], f"{result['why']}\nmeasured: { {k: v for k, v in result.items() if k != 'why'} }"
        assert result["max_abs_diff"] <= 1e-5
