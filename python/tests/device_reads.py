"""Waits for the device, seen without a GPU: :class:`OnDevice` stands for a tensor the engine holds
on its device. Every read of its values to the host that an adapter's own code makes (a
``.cpu()``, ``.tolist()``, ``.item()``, ``.numpy()``, ``torch.equal``, a truth or number test, a
``.to()`` the host), each one wait on a GPU, is appended to :data:`READS`; the tests hold every
adapter's ``device_reads`` to that list. Reads made elsewhere (the tests, torch, the device
path's own code) are not the adapter's and are not listed."""

from __future__ import annotations

import os
import sys

import pytest
import torch

#: For the tests that send host tensors down the device path (``LOGITS_PROCESSING_DEVICE=interpret``).
needs_interpreter = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="the device path through the switch needs Triton's interpreter (TRITON_INTERPRET=1 before "
    "triton is imported: python/tests/conftest.py sets it in the main venv)",
)

#: What adapters' code has read from :class:`OnDevice` tensors, in order: ``(the method's name,
#: the number of values read)``.
READS: list = []

_READS = frozenset(
    {"cpu", "tolist", "item", "numpy", "equal", "__bool__", "__int__", "__float__", "__index__"}
)


class OnDevice(torch.Tensor):
    """A host tensor that stands for one on the engine's device (its values are read as a
    device tensor's would be: to the host, once a read). Tensors computed from it stay
    ``OnDevice``, as they would stay on the device; a read returns a plain host tensor. The
    subclass ``OnCuda`` also says it is on ``cuda:0``, as ``generate()``'s ids are on a GPU."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        read = name in _READS or (name == "to" and _to_host(args[1:], kwargs))
        if read and sys._getframe(1).f_globals.get("__name__", "").startswith("logits_processing.adapters"):
            READS.append((name, args[0].numel()))
        result = super().__torch_function__(func, types, args, kwargs)
        if read and isinstance(result, torch.Tensor):
            return result.as_subclass(torch.Tensor).clone()
        return result


class OnCuda(OnDevice):
    @property
    def device(self):
        return torch.device("cuda:0")


def _to_host(args, kwargs) -> bool:
    target = kwargs.get("device", args[0] if args else None)
    return target is not None and not isinstance(target, torch.dtype) and torch.device(target).type == "cpu"


def on_device(tensor: torch.Tensor, cuda: bool = False) -> OnDevice:
    """``tensor`` as an :class:`OnDevice` (or ``OnCuda``) tensor, sharing its memory."""
    return tensor.as_subclass(OnCuda if cuda else OnDevice)


def reads() -> int:
    """How many reads adapters made so far (compare before and after a step)."""
    return len(READS)
