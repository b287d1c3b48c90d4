"""Child side of ``run_local(callable)``: ``python -m tfaccel.launch._call PAYLOAD RESULT``.

PAYLOAD is a pickle (cloudpickle when installed) of ``(function, args, kwargs)``; the function's return value
is pickled to RESULT. An exception propagates (traceback on stderr, exit 1).
"""

import pickle
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    """Loads the payload, calls it and stores what it returned."""
    payload_path, result_path = (argv if argv is not None else sys.argv[1:])[:2]
    with open(payload_path, "rb") as fh:
        func, args, kwargs = pickle.load(fh)
    value = func(*args, **kwargs)
    try:
        data = pickle.dumps(value)
    except Exception as exc:  # noqa: BLE001 - any pickling failure: keep the run, drop the value
        sys.stderr.write(f"tfaccel: the return value of {func!r} cannot be pickled ({exc}); returning None\n")
        data = pickle.dumps(None)
    with open(result_path, "wb") as fh:
        fh.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
