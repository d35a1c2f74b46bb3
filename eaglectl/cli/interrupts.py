"""Ctrl-C from the first instant: a SIGINT that lands inside an import is delivered again once the import is done.

Python raises KeyboardInterrupt wherever the main thread happens to be. Inside an import that leaves a traceback
of importlib frames, and inside the C++ of torch's import (a pybind11 callback) it aborts the process ("terminate
called after throwing ..."). Everywhere else the CLI turns it into exit 130 with one line.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

REDELIVER_S = 0.1


def _importing(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def deferring(handler: Callable[[int, FrameType | None], None]) -> Callable[[int, FrameType | None], None]:
    """`handler`, run only outside imports: a signal inside one is sent again REDELIVER_S later."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if _importing(frame):
            timer = threading.Timer(REDELIVER_S, os.kill, (os.getpid(), signum))
            timer.daemon = True
            timer.start()
            return
        handler(signum, frame)

    return on_signal


def install(sigterm: Callable[[int, FrameType | None], None]) -> None:
    """Only for the command-line entry points (a library import never changes signal handlers): Ctrl-C, and
    SIGTERM with its handler, deferred out of imports."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, deferring(signal.default_int_handler))
    signal.signal(signal.SIGTERM, deferring(sigterm))
