"""tests/conformance: Keras' own tests (keras_tests/, unmodified) are run by test_keras_conformance.py, one pytest
process per tool with keras_mode_plugin.py; the repository's own run must not collect them itself."""

collect_ignore = ["keras_tests"]
