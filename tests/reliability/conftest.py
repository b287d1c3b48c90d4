"""Fixtures shared by the reliability tests."""

import pytest

import harness
import rel_scenarios as rs


@pytest.fixture(autouse=True)
def _track_scenario_pids():
    """Hands every PID a scenario started to the suite's no-leftover-processes check."""
    before = len(rs.STARTED_PIDS)
    yield
    harness.STARTED_PIDS.extend(rs.STARTED_PIDS[before:])
