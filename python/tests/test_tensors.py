"""Single-row calls on torch and numpy: in place, no copy, and clear errors that edit nothing."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from conftest import TORCH_DTYPES

from logits_processing import (
    DeviceError,
    DTypeError,
    ReadOnlyError,
    ShapeError,
    ThinkingBudgetLogitsProcessor,
    TokenOutOfVocabError,
)
from logits_processing.examples import ForcedSequenceLogitsProcessor, TemperatureProcessor


def processors():
    return [
        TemperatureProcessor(0.5),
        ForcedSequenceLogitsProcessor([1], 2),
        ThinkingBudgetLogitsProcessor(1, 2, 3, 0),
    ]


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_edits_in_place_with_no_copy(dtype):
    storage = torch.ones(10, dtype=dtype)
    view = storage[2:8]  # a view with an offset: the same memory
    TemperatureProcessor(0.5)([], view)
    assert storage.tolist() == [1, 1, 2, 2, 2, 2, 2, 2, 1, 1]
    arr = np.ones(10, dtype=np.float32)
    TemperatureProcessor(0.25)([], arr[2:])
    assert arr.tolist() == [1, 1] + [4] * 8


def test_wrong_rank_dtype_stride_read_only_raise_and_edit_nothing():
    read_only = np.ones(8, dtype=np.float32)
    read_only.flags.writeable = False
    cases = [
        (torch.ones(2, 8), ShapeError),
        (torch.tensor(1.0), ShapeError),
        (torch.ones(16)[::2], ShapeError),
        (np.ones(16, dtype=np.float32)[::2], ShapeError),
        (np.ones(16, dtype=np.float32)[::-1], ShapeError),
        (torch.ones(8, dtype=torch.float64), DTypeError),
        (torch.ones(8, dtype=torch.int64), DTypeError),
        (np.ones(8, dtype=np.float64), DTypeError),
        (read_only, ReadOnlyError),
        ([1.0, 2.0], DTypeError),
    ]
    for logits, error in cases:
        for p in processors():
            before = logits.clone() if isinstance(logits, torch.Tensor) else np.array(logits, copy=True)
            state = getattr(p, "state", None)
            with pytest.raises(error):
                p([1], logits)
            assert np.array_equal(before, np.asarray(logits))
            assert getattr(p, "state", None) == state
    assert issubclass(ShapeError, ValueError) and issubclass(DTypeError, TypeError)
    assert issubclass(ReadOnlyError, ValueError)


def test_a_token_outside_the_row_raises_and_changes_nothing():
    p = ForcedSequenceLogitsProcessor([10], 2)
    logits = torch.ones(4)
    with pytest.raises(TokenOutOfVocabError) as info:
        p([], logits)
    assert isinstance(info.value, IndexError) and isinstance(info.value, ValueError)
    assert torch.all(logits == 1) and p.state == 0


def _fake_cuda_tensor():
    """A DLPack producer that claims CUDA memory (device type 2), built with ctypes."""

    class DLDevice(ctypes.Structure):
        _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]

    class DLDataType(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]

    class DLTensor(ctypes.Structure):
        _fields_ = [
            ("data", ctypes.c_void_p),
            ("device", DLDevice),
            ("ndim", ctypes.c_int32),
            ("dtype", DLDataType),
            ("shape", ctypes.POINTER(ctypes.c_int64)),
            ("strides", ctypes.POINTER(ctypes.c_int64)),
            ("byte_offset", ctypes.c_uint64),
        ]

    class DLManagedTensor(ctypes.Structure):
        _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]

    class FakeCuda:
        def __init__(self):
            self.buffer = (ctypes.c_float * 16)()
            self.shape = (ctypes.c_int64 * 1)(16)
            self.strides = (ctypes.c_int64 * 1)(1)
            self.managed = DLManagedTensor(
                DLTensor(
                    ctypes.addressof(self.buffer),
                    DLDevice(2, 1),
                    1,
                    DLDataType(2, 32, 1),
                    self.shape,
                    self.strides,
                    0,
                ),
                None,
                None,
            )

        def __dlpack_device__(self):
            return (2, 1)

        def __dlpack__(self, **kwargs):
            new = ctypes.pythonapi.PyCapsule_New
            new.restype = ctypes.py_object
            new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
            return new(ctypes.addressof(self.managed), b"dltensor", None)

    return FakeCuda()


def test_cuda_logits_without_cuda_support_name_the_device():
    from logits_processing import _lib

    if _lib.CUDA_SUPPORT:
        pytest.skip("this build dispatches CUDA tensors")
    for p in processors():
        with pytest.raises(DeviceError, match="cuda:1"):
            p([], _fake_cuda_tensor())
    if torch.cuda.is_available():  # a real one, where there is a GPU
        with pytest.raises(DeviceError, match="cuda:0"):
            TemperatureProcessor(0.5)([], torch.ones(8, device="cuda"))


def test_tensors_that_cannot_be_exported_or_edited_are_refused():
    with pytest.raises(DeviceError, match="meta"):
        TemperatureProcessor(0.5)([], torch.empty(8, device="meta"))
    with pytest.raises(DTypeError, match="byte order"):
        TemperatureProcessor(0.5)([], np.ones(8, dtype=">f4"))
    leaf = torch.ones(8, requires_grad=True)
    with pytest.raises(ReadOnlyError, match="grad"):
        TemperatureProcessor(0.5)([], leaf)
    assert torch.all(leaf == 1)
    TemperatureProcessor(0.5)([], leaf.detach())  # the documented way round
    assert torch.all(leaf == 2)


def test_temperature_attribute_is_assignable_and_checked():
    t = TemperatureProcessor()
    assert t.temperature == 1.0
    t.temperature = 0.5
    logits = torch.ones(3)
    t([], logits)
    assert logits.tolist() == [2.0] * 3
    with pytest.raises(ValueError):
        t.temperature = -1
    assert t.temperature == 0.5


def test_forced_sequence_position_by_tokens():
    p = ForcedSequenceLogitsProcessor([5, 6, 7], 0, position="tokens", prompt_len=2)
    assert p.position == "tokens"
    for ids, want in [([9, 9], 5), ([9, 9, 5, 6], 7), ([9, 9, 5, 6], 7), ([9, 9, 5], 6), ([9] * 9, 0)]:
        logits = torch.zeros(8)
        p(ids, logits)
        assert int(logits.argmax()) == want
    with pytest.raises(ValueError):
        ForcedSequenceLogitsProcessor([1], 0, position="steps")


def test_forced_sequence_token_ids_and_eos_are_assignable():
    p = ForcedSequenceLogitsProcessor([1, 2], 0)
    p.token_ids = [4]
    p.eos_id = 3
    for want in (4, 3):
        logits = torch.zeros(8)
        p([], logits)
        assert int(logits.argmax()) == want
    with pytest.raises(ValueError):
        ForcedSequenceLogitsProcessor([1, -2], 0)


def test_no_reference_is_leaked_per_call():
    """numpy's DLPack capsule holds a reference to the array until it is released."""
    import sys

    logits = np.ones(64, dtype=np.float32)
    ids = np.arange(5, dtype=np.int64)
    p = ThinkingBudgetLogitsProcessor(1, 2, 3, 0)
    t = TemperatureProcessor(1.0001)
    before = (sys.getrefcount(logits), sys.getrefcount(ids))
    for _ in range(200):
        p(ids, logits)
        t(ids, logits)
    assert (sys.getrefcount(logits), sys.getrefcount(ids)) == before


def test_threads_use_processors_and_batches_at_once():
    import threading

    from logits_processing import Batch

    errors = []

    def work(seed):
        try:
            batch = Batch(1000)
            batch.add(0, {"kind": "temperature", "temperature": 0.5})
            batch.add(1, {"kind": "forced_sequence", "token_ids": [seed], "eos_token_id": 0})
            temperature = TemperatureProcessor(0.25)
            for _ in range(50):
                block = torch.ones(2, 1000)
                batch.apply(block, [[1], [2]])
                row = np.ones(1000, dtype=np.float32)
                temperature([], row)
                assert block[0, 0] == 2 and row[0] == 4
            assert int(block[1].argmax()) == 0  # EOS after the one forced id
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
