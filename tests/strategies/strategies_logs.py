"""A fixture-free helper that records tfaccel log records (the tfaccel logger does not propagate)."""

import contextlib
import logging
from typing import Iterator, List


@contextlib.contextmanager
def tfaccel_records() -> Iterator[List[logging.LogRecord]]:
    from tfaccel.log import get_logger

    records: List[logging.LogRecord] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = get_logger()
    handler = _Keep(level=logging.DEBUG)
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
