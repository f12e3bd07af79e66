"""Running a script in a session of its own, ended afterwards with everything it started: an
engine process that outlives its script (a failure, a timeout) must not keep a CPU busy."""

from __future__ import annotations

import os
import signal
import subprocess


def run_in_own_session(args: list, timeout: float, **popen) -> subprocess.CompletedProcess:
    """``args`` run with stdout and stderr captured as text; the whole session is killed when it
    ends or when ``timeout`` (seconds) passes (``subprocess.TimeoutExpired`` then propagates)."""
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **popen
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
