"""What Keras' own test runner gives its tests and the source distribution does not ship (Keras' repository has it
in a root conftest.py): the ``requires_trainable_backend`` and ``multi_device`` markers and ``skip_if_backend``,
which ``callbacks/remote_monitor_test.py`` imports as ``from conftest import skip_if_backend``. Written here to the
behaviour Keras documents for the TensorFlow backend: no trainer test is skipped, and ``multi_device`` tests are
skipped (Keras' runner counts several devices for JAX and torch only)."""

import pytest
from keras.src.backend import backend


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires_trainable_backend: mark test for trainable backend only")
    config.addinivalue_line("markers", "multi_device: mark test for running with multiple devices only")


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    for item in items:
        if "multi_device" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="Requires multiple devices"))


def skip_if_backend(given_backend: str, reason: str) -> pytest.MarkDecorator:
    """Skips a test on one backend (Keras' own helper of that name)."""
    return pytest.mark.skipif(backend() == given_backend, reason=reason)
