"""Fixtures of the launcher tests."""

import pytest

from launch_util import kept_log


@pytest.fixture
def launch_log():
    """The messages the tfaccel logger emits during the test."""
    with kept_log() as kept:
        yield kept
