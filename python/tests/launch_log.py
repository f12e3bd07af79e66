"""Counts the Triton kernels' launches in an engine's processes, for the runs under
``LOGITS_PROCESSING_DEVICE=interpret``: :func:`install` makes each launch append a line to the
file ``$LOGITS_PROCESSING_LAUNCH_LOG`` names; :func:`count` reads the lines back. The engines run
our processor in processes of their own (forked, or spawned and importing the runner script
again), so the count goes through a file."""

from __future__ import annotations

import os

LAUNCH_LOG = "LOGITS_PROCESSING_LAUNCH_LOG"


def install() -> None:
    path = os.environ.get(LAUNCH_LOG)
    if not path:
        return
    from logits_processing import kernels

    if getattr(kernels.launch, "logged", False):
        return
    launch = kernels.launch

    def logged(*args):
        with open(path, "a") as log:
            log.write(f"{args[1]}\n")  # the slots (rows) packed
        return launch(*args)

    logged.logged = True
    kernels.launch = logged


def count() -> int:
    try:
        with open(os.environ[LAUNCH_LOG]) as log:
            return len(log.read().split())
    except FileNotFoundError:
        return 0
