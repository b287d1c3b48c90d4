"""A watchdog for long garbage collections of a test process, with the native stacks Python's own cannot show.

Tests here have waited tens of seconds inside one collection with almost no CPU (47 s and 27 s in session 27's clean
clone), and faulthandler's dump shows only where Python allocated when the collection began: the wait is in native
code (a TensorFlow object's destructor). While a collection runs, the process holds the GIL, so no thread of its own
can look; this module runs a small child process instead. ``start(path)`` starts it; the test process writes one
byte when a collection begins (``begin``) and one when it ends (``end``); a collection still running after
``after_s`` seconds gets ``py-spy dump --native`` of the test process appended to ``path`` (where py-spy is
installed; otherwise nothing), once per collection. The child ends with its parent (its pipe closes).
"""

import os
import shutil
import subprocess
import sys
from typing import Optional

_CHILD = r"""
import os, select, subprocess, sys, time
fd, parent, path, after, spy = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5]
running = False
while True:
    ready, _, _ = select.select([fd], [], [], after if running else None)
    if not ready:  # a collection still running after `after` seconds: the parent's native stacks, once
        with open(path, "a") as out:
            out.write(f"py-spy dump --native after {after:.0f} s in one collection ({time.strftime('%H:%M:%S')})\n")
            out.flush()
            subprocess.run([spy, "dump", "--native", "--pid", str(parent)], stdout=out, stderr=out, timeout=60)
        running = False
        continue
    data = os.read(fd, 64)
    if not data:
        break
    running = data[-1:] == b"b"
"""

_pipe: Optional[int] = None
_child: Optional[subprocess.Popen] = None  # kept: a collected Popen of a running process warns


def start(path: str, *, after_s: float) -> bool:
    """Starts the watchdog child for this process; False (and nothing started) without py-spy."""
    global _pipe, _child
    spy = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")
    if spy is None or _pipe is not None:
        return False
    read, write = os.pipe()
    _child = subprocess.Popen([sys.executable, "-c", _CHILD, str(read), str(os.getpid()), path, str(after_s), spy],
                              pass_fds=(read,), stdin=subprocess.DEVNULL)
    os.close(read)
    _pipe = write
    return True


def begin() -> None:
    """A collection began (called from the garbage collector's callback: one write, no allocation to speak of)."""
    if _pipe is not None:
        os.write(_pipe, b"b")


def end() -> None:
    """The collection ended."""
    if _pipe is not None:
        os.write(_pipe, b"e")
