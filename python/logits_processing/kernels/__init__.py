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

from .._lib import DeviceError, _device_layout

# The logits' element types as the kernels take them (apply.py: F32, F16, BF16), and the element
# the kernels read them as (f16 and bf16 as their bits).
DTYPES = {"float32": (0, ctypes.c_float, np.float32), "float16": (1, ctypes.c_int16, np.int16),
          "bfloat16": (2, ctypes.c_int16, np.int16)}
_LAYOUT = _device_layout()
# Logits per program of the apply kernel, and per tile of the band kernel's passes, on a GPU (the
# CUDA crate's tiles, packed.rs TILE); and under the interpreter, whose cost is mostly per
# operation: two rows of 129,280 through min-p took 14.8 s in tiles of 8,192 and 4.0 s in tiles of
# 65,536, the most a radix pass's [tile, 16] histogram compare may hold (Triton's limit on a
# block's elements). The kernels' results do not depend on the tile size.
BLOCK = _LAYOUT["TILE"]
INTERPRET_BLOCK = 65536
# What each kernel is compiled with: no contraction of a multiply and an add into an fma (the CPU
# path rounds both), and the warps per program (packed.rs THREADS).
COMPILE_OPTIONS = {"enable_fp_fusion": False, "num_warps": _LAYOUT["THREADS"] // 32}


def _kernels() -> Any:
    from . import apply

    return apply


def _interpreted(kernels: Any) -> bool:
    """Whether the kernels, and Triton's own library they call, were defined under the interpreter
    (Triton decides when it defines a function: its library's as triton is first imported)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernels.lp_apply, InterpretedFunction) and isinstance(tl.zeros, InterpretedFunction)


def launch(words: bytes, snapshot_words: int, slots: int, list_at: int, truncating: int, vocab: int,
           row_stride: int, rows: int, dtype: str, address: int) -> bytes:
    """Runs the band kernel (when `truncating` rows have a reduction) and the apply kernel on packed
    plans, in place on the host block at `address` (`rows` rows of `row_stride` elements of
    `dtype`), through Triton's interpreter. Returns the words as the kernels left them (the
    reductions' records written), with the `snapshot_words` after them that the band kernel
    writes. Called by the extension."""
    kernels = _kernels()
    if not _interpreted(kernels):
        raise DeviceError(
            "LOGITS_PROCESSING_DEVICE=interpret runs the Triton kernels through Triton's interpreter: "
            "set TRITON_INTERPRET=1 too, before triton is first imported")
    import torch

    code, element, _ = DTYPES[dtype]
    length = (rows - 1) * row_stride + vocab
    logits = torch.from_numpy(np.ctypeslib.as_array((element * length).from_address(address)))
    packed = torch.from_numpy(np.concatenate([np.frombuffer(words, dtype=np.int32),
                                              np.zeros(snapshot_words, dtype=np.int32)]))
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
    return packed.numpy().tobytes()


# The images the CUDA crate ships (`crates/cuda/kernels/triton/`, written by
# python/tools/gen_kernels.py): a cubin for sm_80 (every 8.x GPU runs it: A100, A10, L4, L40,
# RTX 30 and 40), sm_90 (H100, H200) and sm_100 (B200), and PTX for compute_75 that the driver
# compiles at first use for any other GPU (T4, B300, RTX 50). Each as (name, arch, kind, PTX ISA
# version): PTX ISA 8.0 is what every CUDA 12 driver reads, and sm_100 needs 8.6; the cubins come
# from CUDA 12.9's ptxas (Triton's own), which CUDA 12 and 13 drivers alike load.
IMAGES = (("sm80", 80, "cubin", 80), ("sm90", 90, "cubin", 80), ("sm100", 100, "cubin", 86),
          ("compute75", 75, "ptx", 80))
# The kernels' parameters as `triton.compile` takes them (the logits' pointer by dtype).
SIGNATURES = {
    "lp_bands": {"P": "*i32", "list_at": "i32", "vocab": "i32", "row_stride": "i64", "X": None},
    "lp_apply": {"P": "*i32", "n_slots": "i32", "tiles_per_row": "i32", "vocab": "i32",
                 "row_stride": "i64", "X": None},
}


def _ptxas() -> str:
    """Triton's own ptxas of CUDA 12.9 (it uses a CUDA 13 one, `ptxas-blackwell`, from sm_90 on,
    whose cubins need a CUDA 13 driver)."""
    import os

    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def compile_kernels(arch: int, dtype: str = "float32", ptx_version: int | None = None) -> dict[str, Any]:
    """Both kernels for `dtype` compiled for CUDA architecture `arch` (75, 80, 90, 100) without a
    GPU, as the CUDA crate ships them: `{"lp_bands": compiled, "lp_apply": compiled}`, each with
    `.asm["ptx"]`, `.asm["cubin"]` and `.metadata`. No line information (the images do not depend
    on where the source lies) and CUDA 12.9's ptxas for every architecture; `ptx_version` (80 for
    PTX ISA 8.0) defaults to the ptxas's own. Needs Triton without its interpreter."""
    kernels = _kernels()
    if _interpreted(kernels):
        raise DeviceError("compile_kernels needs Triton without its interpreter (TRITON_INTERPRET unset)")
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    code, _, _ = DTYPES[dtype]
    pointer = "*fp32" if code == 0 else "*i16"
    options = dict(COMPILE_OPTIONS)
    if ptx_version is not None:
        options["ptx_version"] = ptx_version
    compiled = {}
    with knobs.compilation.scope(), knobs.nvidia.scope():
        knobs.compilation.disable_line_info = True
        knobs.nvidia.ptxas_blackwell = _ptxas()
        for name, signature in SIGNATURES.items():
            source = ASTSource(
                fn=getattr(kernels, name),
                signature={**{k: v or pointer for k, v in signature.items()}, "DTYPE": "constexpr",
                           "BLOCK": "constexpr"},
                constexprs={"DTYPE": code, "BLOCK": BLOCK},
            )
            compiled[name] = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    return compiled
