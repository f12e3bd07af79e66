"""The device kernels, written in Triton (`apply.py`), and their launch.

The extension packs a step's row plans (`crates/cuda/src/packed.rs`) and, under
`LOGITS_PROCESSING_DEVICE=interpret`, hands the words and the host block to :func:`launch`, which
runs the kernels through Triton's interpreter (`TRITON_INTERPRET=1`) on CPU tensors over the
same memory: the device path, packing, bands and apply included, executed without a GPU.
:func:`compile_kernels` compiles the same source for a GPU architecture ahead of time.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from .._lib import DeviceError

# The logits' element types as the kernels take them (apply.py: F32, F16, BF16), and the element
# the kernels read them as (f16 and bf16 as their bits).
DTYPES = {"float32": (0, ctypes.c_float, np.float32), "float16": (1, ctypes.c_int16, np.int16),
          "bfloat16": (2, ctypes.c_int16, np.int16)}
# Logits per program of the apply kernel, and per tile of the band kernel's passes, on a GPU; and
# under the interpreter, whose cost is mostly per operation: two rows of 129,280 through min-p took
# 14.8 s in tiles of 8,192 and 4.0 s in tiles of 65,536, the most a radix pass's [tile, 16]
# histogram compare may hold (Triton's limit on a block's elements). The kernels' results do
# not depend on the tile size.
BLOCK = 1024
INTERPRET_BLOCK = 65536
# What each kernel is compiled with: no contraction of a multiply and an add into an fma (the CPU
# path rounds both), and the warps per program.
COMPILE_OPTIONS = {"enable_fp_fusion": False, "num_warps": 8}


def _kernels() -> Any:
    from . import apply

    return apply


def _interpreted(kernels: Any) -> bool:
    """Whether the kernels, and Triton's own library they call, were defined under the interpreter
    (Triton decides when it defines a function: its library's as triton is first imported)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernels.lp_apply, InterpretedFunction) and isinstance(tl.zeros, InterpretedFunction)


def launch(words: bytes, slots: int, list_at: int, truncating: int, vocab: int, row_stride: int,
           rows: int, dtype: str, address: int) -> None:
    """Runs the band kernel (when `truncating` rows truncate) and the apply kernel on packed
    plans, in place on the host block at `address` (`rows` rows of `row_stride` elements of
    `dtype`), through Triton's interpreter. Called by the extension."""
    kernels = _kernels()
    if not _interpreted(kernels):
        raise DeviceError(
            "LOGITS_PROCESSING_DEVICE=interpret runs the Triton kernels through Triton's interpreter: "
            "set TRITON_INTERPRET=1 too, before triton is first imported")
    import torch

    code, element, _ = DTYPES[dtype]
    length = (rows - 1) * row_stride + vocab
    logits = torch.from_numpy(np.ctypeslib.as_array((element * length).from_address(address)))
    packed = torch.from_numpy(np.frombuffer(words, dtype=np.int32).copy())
    block = INTERPRET_BLOCK
    # The interpreter computes with numpy: a division by zero or an overflow to infinity is IEEE
    # arithmetic here, not a warning.
    with np.errstate(all="ignore"):
        if truncating:
            kernels.lp_bands[(truncating,)](packed, list_at, vocab, row_stride, logits, DTYPE=code,
                                            BLOCK=block)
        tiles = -(-vocab // block)
        kernels.lp_apply[(slots * tiles,)](packed, slots, tiles, vocab, row_stride, logits, DTYPE=code,
                                           BLOCK=block)


def compile_kernels(arch: int, dtype: str = "float32") -> dict[str, Any]:
    """Both kernels for `dtype` compiled for CUDA architecture `arch` (80 for sm_80, 90, 100),
    without a GPU: `{"lp_bands": compiled, "lp_apply": compiled}`, each with `.asm["ptx"]` and
    `.asm["cubin"]`. Needs Triton without its interpreter."""
    kernels = _kernels()
    if _interpreted(kernels):
        raise DeviceError("compile_kernels needs Triton without its interpreter (TRITON_INTERPRET unset)")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    code, _, _ = DTYPES[dtype]
    pointer = "*fp32" if code == 0 else "*i16"
    signatures = {
        "lp_bands": {"P": "*i32", "list_at": "i32", "vocab": "i32", "row_stride": "i64", "X": pointer},
        "lp_apply": {"P": "*i32", "n_slots": "i32", "tiles_per_row": "i32", "vocab": "i32",
                     "row_stride": "i64", "X": pointer},
    }
    compiled = {}
    for name, signature in signatures.items():
        source = ASTSource(
            fn=getattr(kernels, name),
            signature={**signature, "DTYPE": "constexpr", "BLOCK": "constexpr"},
            constexprs={"DTYPE": code, "BLOCK": BLOCK},
        )
        compiled[name] = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=COMPILE_OPTIONS)
    return compiled
