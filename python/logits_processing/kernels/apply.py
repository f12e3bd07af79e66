"""The device kernels, in Triton: a step's packed row plans applied to a [rows, row_stride] block.

They read the words that `crates/cuda/src/packed.rs` packs (its module docs give the layout) and
do what `crates/cuda/kernels/apply.cu` does, operation for operation, so that the CPU path's
answers come out bit for bit:

- `lp_bands`: one program per row with a reduction; resolves each of the row's reductions, in
  order, over the row as it stands there (the values computed on the fly from the original row):
  a truncation to a band, a conditional force to whether it fires, a value read to the value; and
  writes each into the packed words (with the row itself where the processor reads it at its next
  step);
- `lp_apply`: one program per (row, tile of BLOCK logits): every logit read and written at most
  once; a forced row reads only its survivors; a row of sparse edits alone touches only its tokens.

Arithmetic: IEEE f32 division (`tl.div_rn`), multiplication and addition, never contracted (the
kernels are compiled with `enable_fp_fusion=False`), `tl.fma` exactly where the CPU path fuses;
f16 and bf16 values widened to f32, edited, and rounded back to nearest even after every edit,
NaN keeping its payload as the `half` crate does. The selections (top-k's k-th key, top-p's and
typical's mass cut) are weighted radix selects over the truncation rules' fixed-point weights:
integer sums, exact in any order, so the result does not depend on the radix or the tiling.

The constants (layout, op codes, rule codes, exp's coefficients) come from packed.rs through the
extension (`_lib._device_layout()`), so the two cannot disagree.
"""

from __future__ import annotations

import numpy as np
import triton
import triton.language as tl

from .. import _lib

_C = _lib._device_layout()

DESC_WORDS: tl.constexpr = tl.constexpr(_C["DESC_WORDS"])
BAND_WORDS: tl.constexpr = tl.constexpr(_C["BAND_WORDS"])
DENSE_WORDS: tl.constexpr = tl.constexpr(_C["DENSE_WORDS"])
SPARSE_WORDS: tl.constexpr = tl.constexpr(_C["SPARSE_WORDS"])
OP_BITS: tl.constexpr = tl.constexpr(_C["OP_BITS"])
# A sparse op's head: its code in the low OP_BITS bits, the dense ops before it above.
OP_CODE_MASK: tl.constexpr = tl.constexpr((1 << _C["OP_BITS"]) - 1)
FIXED_BITS: tl.constexpr = tl.constexpr(_C["FIXED_BITS"])
OP_SCALE: tl.constexpr = tl.constexpr(_C["OP_SCALE"])
OP_FORCE_KEEP: tl.constexpr = tl.constexpr(_C["OP_FORCE_KEEP"])
OP_FORCE_SET: tl.constexpr = tl.constexpr(_C["OP_FORCE_SET"])
OP_BAN: tl.constexpr = tl.constexpr(_C["OP_BAN"])
OP_BIAS: tl.constexpr = tl.constexpr(_C["OP_BIAS"])
OP_PENALTY: tl.constexpr = tl.constexpr(_C["OP_PENALTY"])
OP_MASK: tl.constexpr = tl.constexpr(_C["OP_MASK"])
OP_TRUNCATE: tl.constexpr = tl.constexpr(_C["OP_TRUNCATE"])
OP_RAISE: tl.constexpr = tl.constexpr(_C["OP_RAISE"])
OP_SET: tl.constexpr = tl.constexpr(_C["OP_SET"])
OP_FORCE_IF: tl.constexpr = tl.constexpr(_C["OP_FORCE_IF"])
OP_VALUE_AT: tl.constexpr = tl.constexpr(_C["OP_VALUE_AT"])
OP_INF_NAN: tl.constexpr = tl.constexpr(_C["OP_INF_NAN"])
OP_ADD_FROM: tl.constexpr = tl.constexpr(_C["OP_ADD_FROM"])
OP_RESHAPE: tl.constexpr = tl.constexpr(_C["OP_RESHAPE"])
SHAPE_QUADRATIC: tl.constexpr = tl.constexpr(_C["SHAPE_QUADRATIC"])
SHAPE_ADAPTIVE_P: tl.constexpr = tl.constexpr(_C["SHAPE_ADAPTIVE_P"])
SHAPE_LOG_SOFTMAX: tl.constexpr = tl.constexpr(_C["SHAPE_LOG_SOFTMAX"])
LN_LN2_HI: tl.constexpr = tl.constexpr(_C["LN_LN2_HI"])
LN_LN2_LO: tl.constexpr = tl.constexpr(_C["LN_LN2_LO"])
LN_POLY_0: tl.constexpr = tl.constexpr(_C["LN_POLY_0"])
LN_POLY_1: tl.constexpr = tl.constexpr(_C["LN_POLY_1"])
LN_POLY_2: tl.constexpr = tl.constexpr(_C["LN_POLY_2"])
LN_POLY_3: tl.constexpr = tl.constexpr(_C["LN_POLY_3"])
LN_POLY_4: tl.constexpr = tl.constexpr(_C["LN_POLY_4"])
LN_POLY_5: tl.constexpr = tl.constexpr(_C["LN_POLY_5"])
LN_POLY_6: tl.constexpr = tl.constexpr(_C["LN_POLY_6"])
# adaptive-p's 1 / 0.3, rounded to f32 as the host's constant (`1.0 / 0.3f32`).
ADAPTIVE_P_SCALE: tl.constexpr = tl.constexpr(float(np.float32(1.0) / np.float32(0.3)))
TRIGGER_ARGMAX: tl.constexpr = tl.constexpr(_C["TRIGGER_ARGMAX"])
TRIGGER_MAX_PROB_BELOW: tl.constexpr = tl.constexpr(_C["TRIGGER_MAX_PROB_BELOW"])
RULE_TOP_K: tl.constexpr = tl.constexpr(_C["RULE_TOP_K"])
RULE_TOP_P: tl.constexpr = tl.constexpr(_C["RULE_TOP_P"])
RULE_MIN_P: tl.constexpr = tl.constexpr(_C["RULE_MIN_P"])
RULE_TYPICAL: tl.constexpr = tl.constexpr(_C["RULE_TYPICAL"])
RULE_EPSILON: tl.constexpr = tl.constexpr(_C["RULE_EPSILON"])
RULE_ETA: tl.constexpr = tl.constexpr(_C["RULE_ETA"])
RULE_TOP_A: tl.constexpr = tl.constexpr(_C["RULE_TOP_A"])
RULE_XTC: tl.constexpr = tl.constexpr(_C["RULE_XTC"])
RULE_MIROSTAT_V2: tl.constexpr = tl.constexpr(_C["RULE_MIROSTAT_V2"])
RULE_P_LESS: tl.constexpr = tl.constexpr(_C["RULE_P_LESS"])
EXP_MIN: tl.constexpr = tl.constexpr(_C["EXP_MIN"])
EXP_MAX: tl.constexpr = tl.constexpr(_C["EXP_MAX"])
EXP_LOG2_E: tl.constexpr = tl.constexpr(_C["EXP_LOG2_E"])
EXP_SHIFTER: tl.constexpr = tl.constexpr(_C["EXP_SHIFTER"])
EXP_LN2_HI: tl.constexpr = tl.constexpr(_C["EXP_LN2_HI"])
EXP_LN2_LO: tl.constexpr = tl.constexpr(_C["EXP_LN2_LO"])
EXP_POLY_0: tl.constexpr = tl.constexpr(_C["EXP_POLY_0"])
EXP_POLY_1: tl.constexpr = tl.constexpr(_C["EXP_POLY_1"])
EXP_POLY_2: tl.constexpr = tl.constexpr(_C["EXP_POLY_2"])
EXP_POLY_3: tl.constexpr = tl.constexpr(_C["EXP_POLY_3"])
EXP_POLY_4: tl.constexpr = tl.constexpr(_C["EXP_POLY_4"])
EXP_POLY_5: tl.constexpr = tl.constexpr(_C["EXP_POLY_5"])
assert _C["EXP_POLY_LEN"] == 6, "exp's polynomial has six coefficients"

# The word NO_TOKEN as an int32 (the words are loaded as int32).
NO_TOKEN: tl.constexpr = tl.constexpr(_C["NO_TOKEN"] - (1 << 32) if _C["NO_TOKEN"] >= 1 << 31 else _C["NO_TOKEN"])
# The logits' element types (the `dtype` argument).
F32: tl.constexpr = tl.constexpr(0)
F16: tl.constexpr = tl.constexpr(1)
BF16: tl.constexpr = tl.constexpr(2)
# Every bit of an order key.
ALL_ONES: tl.constexpr = tl.constexpr(0xFFFFFFFF)
# The selection's radix: any width gives the same key (the sums are exact); 4 bits keeps each
# tile's histogram small.
RADIX_BITS: tl.constexpr = tl.constexpr(4)
RADIX_BINS: tl.constexpr = tl.constexpr(16)
# What a selection weighs (packed.rs, select_key's `key_of`).
BY_COUNT: tl.constexpr = tl.constexpr(0)
BY_MASS: tl.constexpr = tl.constexpr(1)
TYPICAL_BY_COUNT: tl.constexpr = tl.constexpr(2)
TYPICAL_BY_MASS: tl.constexpr = tl.constexpr(3)
# order_key(-inf) and order_key(+inf).
NEG_INF_KEY: tl.constexpr = tl.constexpr(0x007FFFFF)
POS_INF_KEY: tl.constexpr = tl.constexpr(0xFF800000)
INF: tl.constexpr = tl.constexpr(float("inf"))
# The largest finite value of each element type (`Logit::MAX`: inf/NaN removal's bounds).
F32_MAX: tl.constexpr = tl.constexpr(3.4028234663852886e38)
F16_MAX: tl.constexpr = tl.constexpr(65504.0)
BF16_MAX: tl.constexpr = tl.constexpr(3.3895313892515355e38)
# 2^FIXED_BITS (fixed's scale) and 2^-64 (exp's scale below the normal range), exact in f32.
FIXED_SCALE: tl.constexpr = tl.constexpr(float(2 ** _C["FIXED_BITS"]))
TWO_TO_MINUS_64: tl.constexpr = tl.constexpr(2.0 ** -64)


# ------------------------------------------------------------------------------------------------
# Element types.


@triton.jit
def _as_f32(word):
    return word.to(tl.float32, bitcast=True)


@triton.jit
def _bits(v):
    return v.to(tl.uint32, bitcast=True)


@triton.jit
def _f32_to_f16_bits(v):
    # Round to nearest even (the conversion); NaN keeps its sign and top payload bits, made quiet.
    x = _bits(v)
    nan = (x & 0x7FFFFFFF) > 0x7F800000
    quiet = ((x & 0x80000000) >> 16) | 0x7C00 | 0x0200 | ((x & 0x007FFFFF) >> 13)
    rounded = v.to(tl.float16, fp_downcast_rounding="rtne").to(tl.uint16, bitcast=True).to(tl.uint32)
    return tl.where(nan, quiet, rounded)


@triton.jit
def _f32_to_bf16_bits(v):
    # Round to nearest even, written out (as apply.cu's, and `half::bf16::from_f32`'s NaN).
    x = _bits(v)
    nan = (x & 0x7FFFFFFF) > 0x7F800000
    up = ((x & 0x00008000) != 0) & ((x & 0x00017FFF) != 0)
    high = x >> 16
    return tl.where(nan, high | 0x0040, tl.where(up, high + 1, high))


@triton.jit
def _f16_bits_to_f32(h):
    return h.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _bf16_bits_to_f32(h):
    return (h << 16).to(tl.float32, bitcast=True)


@triton.jit
def _round(v, DTYPE: tl.constexpr):
    """`v` rounded to the logits' type and widened back (`Logit::from_f32`)."""
    if DTYPE == F16:
        return _f16_bits_to_f32(_f32_to_f16_bits(v))
    elif DTYPE == BF16:
        return _bf16_bits_to_f32(_f32_to_bf16_bits(v))
    else:
        return v


@triton.jit
def _load(x, i, mask, DTYPE: tl.constexpr):
    if DTYPE == F32:
        return tl.load(x + i, mask=mask, other=0.0)
    else:
        h = tl.load(x + i, mask=mask, other=0).to(tl.uint16, bitcast=True).to(tl.uint32)
        if DTYPE == F16:
            return _f16_bits_to_f32(h)
        else:
            return _bf16_bits_to_f32(h)


@triton.jit
def _store(x, i, v, mask, DTYPE: tl.constexpr):
    if DTYPE == F32:
        tl.store(x + i, v, mask=mask)
    else:
        if DTYPE == F16:
            h = _f32_to_f16_bits(v)
        else:
            h = _f32_to_bf16_bits(v)
        tl.store(x + i, h.to(tl.uint16).to(tl.int16, bitcast=True), mask=mask)


@triton.jit
def _is_finite(v):
    return (v == v) & (tl.abs(v) != INF)


# ------------------------------------------------------------------------------------------------
# The plan's edits.


@triton.jit
def _dense_op(P, op, i, v, DTYPE: tl.constexpr):
    """`Edit::value` of dense op `op` (Scale, Force, Mask, Truncate) for the logits at `i`."""
    code = tl.load(P + op)
    a = tl.load(P + op + 1)
    if code == OP_SCALE:
        v = _round(tl.div_rn(v, _as_f32(a)), DTYPE)
    elif code == OP_FORCE_KEEP:
        v = tl.where(i == a, _round(v + 0.0, DTYPE), -INF)
    elif code == OP_FORCE_SET:
        # The value's bits broadcast over the lanes (an f32 add of zeros would make -0.0 +0.0).
        value = _round(_as_f32(tl.zeros_like(i) + tl.load(P + op + 2)), DTYPE)
        v = tl.where(i == a, value, -INF)
    elif code == OP_MASK:
        n_words = tl.load(P + op + 2)
        beyond = tl.load(P + op + 3) != 0
        w = i // 32
        inside = w < n_words
        word = tl.load(P + a + w, mask=inside, other=0)
        allowed = tl.where(inside, ((word >> (i % 32)) & 1) != 0, beyond)
        v = tl.where(allowed, v, -INF)
    elif code == OP_TRUNCATE:
        lo = _as_f32(tl.load(P + a))
        hi = _as_f32(tl.load(P + a + 1))
        v = tl.where((v < lo) | (v > hi), -INF, v)
    elif code == OP_FORCE_IF:
        # A force keeping its token's value, where the band kernel found the trigger fired.
        if (tl.load(P + tl.load(P + op + 2) + 2) != 0) & (a != NO_TOKEN):
            v = tl.where(i == a, _round(v + 0.0, DTYPE), -INF)
    elif code == OP_RESHAPE:
        # `Shape::apply`, around the row's largest value the band kernel found (none: the row
        # stays).
        if tl.load(P + a + 4) != 0:
            mx = _as_f32(tl.load(P + a + 3))
            first = _as_f32(tl.load(P + a + 1))
            if tl.load(P + a) == SHAPE_QUADRATIC:
                # Smoothing: -k d^2 + s d^3 + max, d = x - max.
                s = _as_f32(tl.load(P + a + 2))
                d = v - mx
                y = (-(first * (d * d)) + s * (d * d * d)) + mx
                # An overflow of a finite logit: in f64, saturated at the f32 extremes.
                d64 = v.to(tl.float64) - mx.to(tl.float64)
                wide = (-(first.to(tl.float64) * d64 * d64) + s.to(tl.float64) * d64 * d64 * d64) + \
                    mx.to(tl.float64)
                saturated = tl.minimum(tl.maximum(wide, -F32_MAX), F32_MAX).to(tl.float32)
                y = tl.where(_is_finite(y) | ~_is_finite(v), y, saturated)
            elif tl.load(P + a) == SHAPE_ADAPTIVE_P:
                # adaptive-p: 5 - 10 d^2 / (1 + d), d = |p - target| / 0.3, p = exp(x - max) / S.
                p = tl.div_rn(_exp(v - mx), _as_f32(tl.load(P + a + 5)))
                d = tl.abs((p - first) * ADAPTIVE_P_SCALE)
                y = 5.0 - tl.div_rn((10.0 * d) * d, 1.0 + d)
            else:
                # log-softmax: (x - max) - ln S.
                y = (v - mx) - _as_f32(tl.load(P + a + 5))
            v = _round(tl.where(v == -INF, v, y), DTYPE)
    elif code == OP_INF_NAN:
        if DTYPE == F32:
            top = F32_MAX
        elif DTYPE == F16:
            top = F16_MAX
        else:
            top = BF16_MAX
        v = tl.where(v != v, 0.0, tl.where(v == INF, top, tl.where(v == -INF, -top, v)))
    return v


@triton.jit
def _sparse_op(P, code, word, active, v, DTYPE: tl.constexpr):
    """`Edit::value` of a touched token's own sparse op (Ban, Bias, Penalty, Raise, Set, Add)."""
    x = _as_f32(word)
    bias = _round(v + x, DTYPE)
    penalty = _round(tl.where(v < 0.0, v * x, tl.div_rn(v, x)), DTYPE)
    # x + |x| * factor on a finite logit, two roundings; a non-finite one stays.
    raised = tl.where(_is_finite(v), _round(v + tl.abs(v) * x, DTYPE), v)
    # x + factor * value on a finite logit, `value` the source's as the band kernel read it.
    adds = active & (code == OP_ADD_FROM)
    source = _as_f32(tl.load(P + word, mask=adds, other=0))
    factor = _as_f32(tl.load(P + word + 1, mask=adds, other=0))
    added = tl.where(_is_finite(v), _round(v + factor * source, DTYPE), v)
    out = tl.where(code == OP_BAN, -INF, v)
    out = tl.where(code == OP_BIAS, bias, out)
    out = tl.where(code == OP_PENALTY, penalty, out)
    out = tl.where(code == OP_RAISE, raised, out)
    out = tl.where(adds, added, out)
    return tl.where(code == OP_SET, _round(x, DTYPE), out)


@triton.jit
def _fill(i, v, forced, set_after):
    """Where a pass ends (a reduction, a whole-row edit, the plan's end): a logit that the pass's
    last force did not name is -inf, unless a Set after that force names it (`RowPlan::run`
    fills a forced pass)."""
    return tl.where((forced != NO_TOKEN) & (i != forced) & (~set_after), -INF, v)


@triton.jit
def _lower_bound(P, begin, n, i):
    """Each lane's first position in P[begin, begin + n) (sorted) whose word is >= `i`."""
    lo = tl.zeros_like(i)
    hi = lo + n
    while tl.max(hi - lo, 0) > 0:
        live = lo < hi
        mid = lo + (hi - lo) // 2
        word = tl.load(P + begin + mid, mask=live, other=0)
        right = live & (word < i)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(live & (~right), mid, hi)
    return lo


@triton.jit
def _find(P, begin, n, i):
    """Each lane's place in the sorted list P[begin, begin + n), or -1."""
    at = _lower_bound(P, begin, n, i)
    inside = at < n
    word = tl.load(P + begin + at, mask=inside, other=-1)
    return tl.where(inside & (word == i), at, -1)


@triton.jit
def _eval(P, d, i, v, dense_end, SEGMENTS: tl.constexpr, DTYPE: tl.constexpr):
    """The logits at `i`, of values `v` before the plan, through dense ops [0, dense_end) and
    each touched token's own sparse ops before dense op `dense_end`, merged in plan order, each
    pass filled as `RowPlan::run` fills a forced one. The passes end at whole-row edits and at the
    end; with SEGMENTS (the row as the reduction at `dense_end` sees it) at every reduction too."""
    dense = tl.load(d + 2)
    program = _find(P, tl.load(d + 4), tl.load(d + 5), i)
    bounds = tl.load(d + 6)
    touched = program >= 0
    s = tl.load(P + bounds + program, mask=touched, other=0)
    end = tl.load(P + bounds + program + 1, mask=touched, other=0)
    # The pass's last force so far, and whether this lane's token was set after it.
    forced = tl.full([], NO_TOKEN, tl.int32)
    set_after = i < 0  # all false
    for j in range(0, dense_end + 1):
        # This lane's sparse ops that come before dense op j.
        active = s < end
        head = tl.load(P + s, mask=active, other=0).to(tl.uint32, bitcast=True)
        active = active & ((head >> OP_BITS).to(tl.int32) <= j)
        while tl.max(active.to(tl.int32), 0) > 0:
            code = (head & OP_CODE_MASK).to(tl.int32)
            word = tl.load(P + s + 1, mask=active, other=0)
            v = tl.where(active, _sparse_op(P, code, word, active, v, DTYPE), v)
            set_after = set_after | (active & (code == OP_SET))
            s = tl.where(active, s + SPARSE_WORDS, s)
            active = s < end
            head = tl.load(P + s, mask=active, other=0).to(tl.uint32, bitcast=True)
            active = active & ((head >> OP_BITS).to(tl.int32) <= j)
        if j < dense_end:
            op = dense + j * DENSE_WORDS
            code = tl.load(P + op)
            a = tl.load(P + op + 1)
            reduction = (code == OP_TRUNCATE) | (code == OP_FORCE_IF) | (code == OP_VALUE_AT) | \
                (code == OP_RESHAPE)
            if (code == OP_INF_NAN) | (SEGMENTS & reduction):
                v = _fill(i, v, forced, set_after)
                forced = tl.full([], NO_TOKEN, tl.int32)
            v = _dense_op(P, op, i, v, DTYPE)
            forces = (code == OP_FORCE_KEEP) | (code == OP_FORCE_SET)
            if code == OP_FORCE_IF:
                forces = (a != NO_TOKEN) & (tl.load(P + tl.load(P + op + 2) + 2) != 0)
            forced = tl.where(forces, a, forced)
            set_after = set_after & (~forces)
    return _fill(i, v, forced, set_after)


# ------------------------------------------------------------------------------------------------
# The apply kernel.


@triton.jit
def lp_apply(P, n_slots, tiles_per_row, vocab, row_stride, X, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    slot = pid // tiles_per_row
    tile = pid - slot * tiles_per_row
    d = P + slot * DESC_WORDS
    row = tl.load(d).to(tl.int64)
    forced = tl.load(d + 1)
    n_dense = tl.load(d + 3)
    n_eos = tl.load(d + 11)
    x = X + row * row_stride
    i = tile * BLOCK + tl.arange(0, BLOCK)
    inside = i < vocab
    if forced != NO_TOKEN:
        # -inf everywhere but the survivors (the forced token, the tokens a Set after the force
        # names), which alone are read.
        survives = inside & ((i == forced) | (_find(P, tl.load(d + 8), tl.load(d + 9), i) >= 0))
        v = _eval(P, d, i, _load(x, i, survives, DTYPE), n_dense, False, DTYPE)
        _store(x, i, tl.where(survives, v, -INF), inside, DTYPE)
        finite = survives & _is_finite(v)
    else:
        read = inside
        if n_dense == 0:
            # Sparse edits alone: the touched tokens read and written, nothing else (but the
            # first tile's whole read, where the safety net below looks for a finite logit).
            written = inside & (_find(P, tl.load(d + 4), tl.load(d + 5), i) >= 0)
            if (n_eos == 0) | (tile != 0):
                read = written
        else:
            written = inside
        v = _eval(P, d, i, _load(x, i, read, DTYPE), n_dense, False, DTYPE)
        _store(x, i, v, written, DTYPE)
        finite = read & _is_finite(v)
    if n_eos > 0:
        _safety_net(P, d, x, vocab, tiles_per_row, finite, (forced == NO_TOKEN) & (n_dense == 0), DTYPE,
                    BLOCK)


@triton.jit
def _safety_net(P, d, x, vocab, tiles_per_row, finite, sparse, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    """A row the step leaves with no finite logit allows only its EOS ids, at 0.0 (`Pipeline`'s
    safety net): each program says whether its tile kept one; the row's last program decides (for
    a row of sparse edits, whose untouched tiles no program read but the first, by reading the
    row itself)."""
    tl.atomic_or(d + 12, tl.max(finite.to(tl.int32), 0), sem="relaxed")
    done = tl.atomic_add(d + 13, 1, sem="acq_rel")
    if done == tiles_per_row - 1:
        kept = tl.atomic_or(d + 12, 0, sem="acquire") != 0
        if (~kept) & sparse:
            for begin in range(0, vocab, BLOCK):
                i = begin + tl.arange(0, BLOCK)
                inside = i < vocab
                kept = kept | (tl.max((inside & _is_finite(_load(x, i, inside, DTYPE))).to(tl.int32), 0) != 0)
        if ~kept:
            for begin in range(0, vocab, BLOCK):
                i = begin + tl.arange(0, BLOCK)
                _store(x, i, tl.full([BLOCK], -INF, tl.float32), i < vocab, DTYPE)
            eos = tl.load(d + 10)
            n_eos = tl.load(d + 11)
            for first in range(0, n_eos, BLOCK):
                k = first + tl.arange(0, BLOCK)
                listed = k < n_eos
                token = tl.load(P + eos + k, mask=listed, other=0)
                _store(x, token, tl.zeros([BLOCK], tl.float32), listed, DTYPE)


# ------------------------------------------------------------------------------------------------
# The band kernel.


@triton.jit
def _order_key(v):
    """The key that orders f32 as `f32::total_cmp` does (truncation/gpu_shared.rs: order_key)."""
    b = _bits(v)
    # `^ ALL_ONES`, not `~`: Triton 3.7's interpreter cannot invert an unsigned integer.
    return tl.where((b & 0x80000000) != 0, b ^ ALL_ONES, b | 0x80000000)


@triton.jit
def _from_order_key(key):
    return tl.where((key & 0x80000000) != 0, key & 0x7FFFFFFF, key ^ ALL_ONES).to(tl.float32, bitcast=True)


@triton.jit
def _pow2(e):
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _exp(x):
    """truncation/gpu_shared.rs's exp, operation for operation (IEEE basic operations and fma only)."""
    n = tl.fma(x, EXP_LOG2_E, EXP_SHIFTER) - EXP_SHIFTER
    r = tl.fma(n, -EXP_LN2_HI, x)
    r = tl.fma(n, -EXP_LN2_LO, r)
    p = tl.fma(tl.zeros_like(r) + EXP_POLY_0, r, EXP_POLY_1)
    p = tl.fma(p, r, EXP_POLY_2)
    p = tl.fma(p, r, EXP_POLY_3)
    p = tl.fma(p, r, EXP_POLY_4)
    p = tl.fma(p, r, EXP_POLY_5)
    y = tl.fma(p, r * r, r) + 1.0
    # |n| is at most 150 here; outside [EXP_MIN, EXP_MAX] the result is chosen below.
    e = tl.minimum(tl.maximum(n, -200.0), 200.0).to(tl.int32)
    low = (y * _pow2(tl.maximum(e + 64, -126))) * TWO_TO_MINUS_64
    high = (y * 2.0) * _pow2(tl.minimum(e - 1, 127))
    mid = y * _pow2(tl.minimum(tl.maximum(e, -126), 127))
    out = tl.where(e < -126, low, tl.where(e > 127, high, mid))
    out = tl.where(x < EXP_MIN, 0.0, out)
    out = tl.where(x > EXP_MAX, INF, out)
    return tl.where(x != x, x, out)


@triton.jit
def _ln(x):
    """truncation/gpu_shared.rs's ln of an f64 at least 1, operation for operation (fdlibm's)."""
    bits = x.to(tl.int64, bitcast=True)
    high = (bits >> 32).to(tl.int32)
    low = bits & 0xFFFFFFFF
    k = (high >> 20) - 1023
    high = high & 0x000FFFFF
    i = (high + 0x95F64) & 0x00100000
    x = (((high | (i ^ 0x3FF00000)).to(tl.int64) << 32) | low).to(tl.float64, bitcast=True)
    k += i >> 20
    f = x - 1.0
    dk = k.to(tl.float64)
    # |f| < 2^-20.
    r_small = f * f * (0.5 - (1.0 / 3.0) * f)
    small = tl.where(f == 0.0, dk * LN_LN2_HI + dk * LN_LN2_LO, dk * LN_LN2_HI - ((r_small - dk * LN_LN2_LO) - f))
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (LN_POLY_1 + w * (LN_POLY_3 + w * LN_POLY_5))
    t2 = z * (LN_POLY_0 + w * (LN_POLY_2 + w * (LN_POLY_4 + w * LN_POLY_6)))
    r = t2 + t1
    hfsq = 0.5 * f * f
    wide = dk * LN_LN2_HI - ((hfsq - (s * (hfsq + r) + dk * LN_LN2_LO)) - f)
    narrow = dk * LN_LN2_HI - ((s * (f - r) - dk * LN_LN2_LO) - f)
    out = tl.where(((high - 0x6147A) | (0x6B851 - high)) > 0, wide, narrow)
    return tl.where((0x000FFFFF & (2 + high)) < 3, small, out)


@triton.jit
def _round_even(x):
    """A non-negative f64 below 2^63 rounded to an integer, to nearest even (`round_ties_even`):
    below 2^52 an f64 addition of 2^52 rounds to an integer; above, x is one."""
    return tl.where(x < 4503599627370496.0, (x + 4503599627370496.0) - 4503599627370496.0, x)


@triton.jit
def _fixed(v):
    """round(v * 2^FIXED_BITS) to nearest even, v non-negative (truncation/gpu_shared.rs: fixed)."""
    x = v * FIXED_SCALE
    # Below 2^23 an f32 addition of 2^23 rounds to an integer, to nearest even; above, x is one.
    rounded = tl.where(x < 8388608.0, (x + 8388608.0) - 8388608.0, x)
    return rounded.to(tl.int64)


@triton.jit
def _weights(v, mx):
    """The weights `v` adds to the sum and to the entropy sum (apply.cu: Softmax::weights)."""
    diff = v - mx
    q = _exp(diff)
    counts = (v == v) & (q > 0.0)
    w = tl.where(counts, _fixed(tl.where(counts, q, 0.0)), 0)
    e = tl.where(counts, _fixed(tl.where(counts, q * -diff, 0.0)), 0)
    return w, e


@triton.jit
def _keyed(v, inside, mx, shift, BY: tl.constexpr):
    """A selection's keys, weights and which values take part (apply.cu: CountKey, MassKey,
    TypicalKey)."""
    if BY == BY_COUNT or BY == BY_MASS:
        valid = inside & (v == v)
        key = _order_key(v)
    else:
        valid = inside & (v == v) & (v != -INF)
        key = _order_key(tl.abs((v - mx) + shift)) ^ ALL_ONES
    if BY == BY_COUNT or BY == TYPICAL_BY_COUNT:
        w = tl.where(valid, 1, 0).to(tl.int64)
    else:
        w, _ = _weights(v, mx)
        w = tl.where(valid, w, 0)
    return key, w, valid


@triton.jit(noinline=True)
def _values(P, d, x, vocab, t, begin, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    """The tile at `begin` of the row as the truncation at dense op `t` sees it."""
    i = begin + tl.arange(0, BLOCK)
    inside = i < vocab
    v = _eval(P, d, i, _load(x, i, inside, DTYPE), t, True, DTYPE)
    return v, inside


@triton.jit(noinline=True)
def _select_key(P, d, x, vocab, t, mx, shift, target, BY: tl.constexpr, CLAMP: tl.constexpr,
                DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    """The largest key at which the weights of the keys at or above it reach `target` (f64
    compare), and whether there is one: the total reaches the target and the target is positive
    (with CLAMP, the target is at most the total). apply.cu: select_key."""
    bins = tl.arange(0, RADIX_BINS)
    prefix = tl.zeros([], tl.uint32)
    above = tl.zeros([], tl.int64)
    found = target > 0.0
    # A loop, not unrolled: each pass inlines the plan's evaluation.
    for p in range(0, 32 // RADIX_BITS):
        shift_bits = 32 - RADIX_BITS * (p + 1)
        hist = tl.zeros([RADIX_BINS], tl.int64)
        for begin in range(0, vocab, BLOCK):
            v, inside = _values(P, d, x, vocab, t, begin, DTYPE, BLOCK)
            key, w, valid = _keyed(v, inside, mx, shift, BY)
            if p > 0:
                # The key's digits above this pass's are those chosen so far.
                chosen_bits = shift_bits + RADIX_BITS
                valid = valid & ((key >> chosen_bits) == (prefix >> chosen_bits))
            digit = ((key >> shift_bits) & (RADIX_BINS - 1)).to(tl.int32)
            hits = (digit[:, None] == bins[None, :]) & valid[:, None]
            hist += tl.sum(tl.where(hits, w[:, None], 0), 0)
        # Each bin's sum with the bins above it.
        suffix = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist
        if p == 0:
            total = tl.sum(hist, 0).to(tl.float64)
            if CLAMP:
                target = tl.minimum(target, total)
            found = (target > 0.0) & (total >= target)
        reached = above + suffix
        chosen = ((reached - hist).to(tl.float64) < target) & (reached.to(tl.float64) >= target)
        c = tl.maximum(tl.max(tl.where(chosen, bins, -1), 0), 0)
        above += tl.sum(tl.where(bins == c, suffix - hist, 0), 0)
        prefix = prefix | (c.to(tl.uint32) << shift_bits)
    return found, prefix


@triton.jit
def _kth(P, d, x, vocab, t, k, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    """The key of the k-th largest value, or order_key(-inf) when there are fewer."""
    found, key = _select_key(P, d, x, vocab, t, 0.0, 0.0, k.to(tl.float64), BY_COUNT, False, DTYPE, BLOCK)
    return tl.where(found, key, NEG_INF_KEY)


@triton.jit
def _largest(P, d, x, vocab, t, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    """The row's largest value but NaN as it stands at dense op `t`, by `f32::total_cmp` (-inf for
    none): `truncation::largest`."""
    max_key = tl.full([], NEG_INF_KEY, tl.uint32)
    for begin in range(0, vocab, BLOCK):
        v, inside = _values(P, d, x, vocab, t, begin, DTYPE, BLOCK)
        keys = tl.where(inside & (v == v), _order_key(v), NEG_INF_KEY)
        max_key = tl.maximum(max_key, tl.max(keys, 0))
    return _from_order_key(max_key)


@triton.jit
def _resolve_band(P, d, x, vocab, t, rule, parameter, min_keep, extra, DTYPE: tl.constexpr,
                  BLOCK: tl.constexpr):
    """The band of the truncation at dense op `t` (`Truncation::band`, truncation/*.rs)."""
    lo = tl.full([], -INF, tl.float32)
    hi = tl.full([], INF, tl.float32)
    min_keep = min_keep.to(tl.uint32, bitcast=True)
    if rule == RULE_TOP_K:
        k = tl.maximum(parameter.to(tl.uint32, bitcast=True), min_keep)
        lo = _from_order_key(_kth(P, d, x, vocab, t, k, DTYPE, BLOCK))
    else:
        mx = _largest(P, d, x, vocab, t, DTYPE, BLOCK)
        if (mx > -INF) & (mx < INF):
            # The fixed-point sums.
            total = tl.zeros([], tl.int64)
            entropy = tl.zeros([], tl.int64)
            for begin in range(0, vocab, BLOCK):
                v, inside = _values(P, d, x, vocab, t, begin, DTYPE, BLOCK)
                w, e = _weights(v, mx)
                total += tl.sum(tl.where(inside, w, 0), 0)
                entropy += tl.sum(tl.where(inside, e, 0), 0)
            p = _as_f32(parameter)
            target = p.to(tl.float64) * total.to(tl.float64)
            shift = (entropy.to(tl.float64) / total.to(tl.float64)).to(tl.float32)
            if rule == RULE_TYPICAL:
                found, mass_cut = _select_key(P, d, x, vocab, t, mx, shift, target, TYPICAL_BY_MASS, False,
                                              DTYPE, BLOCK)
                if found:
                    found, count_cut = _select_key(P, d, x, vocab, t, mx, shift,
                                                   min_keep.to(tl.float64), TYPICAL_BY_COUNT, True,
                                                   DTYPE, BLOCK)
                    if found:
                        # The smallest and largest value scoring at most the cut.
                        cut = tl.minimum(mass_cut, count_cut)
                        lo_key = tl.full([], POS_INF_KEY, tl.uint32)
                        hi_key = tl.full([], NEG_INF_KEY, tl.uint32)
                        for begin in range(0, vocab, BLOCK):
                            v, inside = _values(P, d, x, vocab, t, begin, DTYPE, BLOCK)
                            key, _, valid = _keyed(v, inside, mx, shift, TYPICAL_BY_COUNT)
                            keep = valid & (key >= cut)
                            lo_key = tl.minimum(lo_key, tl.min(tl.where(keep, _order_key(v), POS_INF_KEY), 0))
                            hi_key = tl.maximum(hi_key, tl.max(tl.where(keep, _order_key(v), NEG_INF_KEY), 0))
                        lo = _from_order_key(lo_key)
                        hi = _from_order_key(hi_key)
            elif rule == RULE_TOP_P:
                found, key = _select_key(P, d, x, vocab, t, mx, shift, target, BY_MASS, False, DTYPE, BLOCK)
                kth = _kth(P, d, x, vocab, t, min_keep, DTYPE, BLOCK)
                lo = _from_order_key(tl.minimum(tl.where(found, key, NEG_INF_KEY), kth))
            else:
                # The smallest value but -inf whose q reaches the rule's threshold
                # (select.rs: lowest_reaching).
                scale = (total.to(tl.float64) / FIXED_SCALE).to(tl.float32)
                threshold = p
                if rule == RULE_EPSILON:
                    threshold = p * scale
                elif rule == RULE_ETA:
                    threshold = tl.minimum(p * scale, tl.sqrt_rn(p) * _exp(-shift))
                elif rule == RULE_TOP_A:
                    threshold = tl.div_rn(p, scale)
                elif rule == RULE_XTC:
                    threshold = p * scale
                elif rule == RULE_P_LESS:
                    # The collision probability sum p^2 = sum q^2 / S (fixed point, exact), or
                    # p-less-norm's (n sum p^2 - 1) / (n - 1) over the n candidates, in q units.
                    squares = tl.zeros([], tl.int64)
                    n = tl.zeros([], tl.int64)
                    for begin in range(0, vocab, BLOCK):
                        v, inside = _values(P, d, x, vocab, t, begin, DTYPE, BLOCK)
                        candidate = inside & (v == v) & (v != -INF)
                        q = _exp(v - mx).to(tl.float64)
                        squared = _round_even(q * q * FIXED_SCALE).to(tl.int64)
                        squares += tl.sum(tl.where(candidate, squared, 0), 0)
                        n += tl.sum(candidate.to(tl.int64), 0)
                    sum = scale.to(tl.float64)
                    collision = squares.to(tl.float64) / FIXED_SCALE / sum
                    if parameter != 0:
                        normalized = (n.to(tl.float64) * collision - sum) / (n.to(tl.float64) - 1.0)
                        collision = tl.where(n <= 1, 0.0, tl.maximum(normalized, 0.0))
                    threshold = tl.minimum(collision.to(tl.float32), 1.0)
                elif rule == RULE_MIROSTAT_V2:
                    # `2^-mu` in f64, its bits in `parameter` (low) and `extra` (high).
                    bits = (extra.to(tl.uint32, bitcast=True).to(tl.uint64) << 32) | \
                        parameter.to(tl.uint32, bitcast=True).to(tl.uint64)
                    threshold = (scale.to(tl.float64) * bits.to(tl.float64, bitcast=True)).to(tl.float32)
                lo_key = tl.full([], POS_INF_KEY, tl.uint32)
                for begin in range(0, vocab, BLOCK):
                    v, inside = _values(P, d, x, vocab, t, begin, DTYPE, BLOCK)
                    keep = inside & (v == v) & (v != -INF) & (_exp(v - mx) >= threshold)
                    lo_key = tl.minimum(lo_key, tl.min(tl.where(keep, _order_key(v), POS_INF_KEY), 0))
                if rule == RULE_XTC:
                    # Every value above the cut removed, when that removes any and leaves at
                    # least `min_keep` finite values (truncation/xtc.rs).
                    cut = _from_order_key(lo_key)
                    removed = tl.zeros([], tl.int64)
                    finite = tl.zeros([], tl.int64)
                    for begin in range(0, vocab, BLOCK):
                        v, inside = _values(P, d, x, vocab, t, begin, DTYPE, BLOCK)
                        removed += tl.sum(tl.where(inside & (v > cut), 1, 0).to(tl.int64), 0)
                        finite += tl.sum(tl.where(inside & _is_finite(v), 1, 0).to(tl.int64), 0)
                    enough = (min_keep <= 1) | (finite - removed >= min_keep.to(tl.int64))
                    if (removed > 0) & enough:
                        hi = cut
                elif rule == RULE_MIROSTAT_V2:
                    lo = _from_order_key(tl.minimum(lo_key, _order_key(mx)))
                elif (rule != RULE_TOP_A) | (p > 0.0):
                    kth = _kth(P, d, x, vocab, t, min_keep, DTYPE, BLOCK)
                    lo = _from_order_key(tl.minimum(lo_key, kth))
    return lo, hi


@triton.jit
def _trigger(P, d, x, vocab, t, trigger, parameter, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    """Whether the ForceIf at dense op `t` fires over the row as it stands there
    (`Trigger::holds`)."""
    max_key = tl.full([], NEG_INF_KEY, tl.uint32)
    token_key = tl.full([], NEG_INF_KEY, tl.uint32)
    for begin in range(0, vocab, BLOCK):
        v, inside = _values(P, d, x, vocab, t, begin, DTYPE, BLOCK)
        keys = tl.where(inside & (v == v), _order_key(v), NEG_INF_KEY)
        max_key = tl.maximum(max_key, tl.max(keys, 0))
        i = begin + tl.arange(0, BLOCK)
        token_key = tl.maximum(token_key, tl.max(tl.where(i == parameter, keys, NEG_INF_KEY), 0))
    mx = _from_order_key(max_key)
    fired = max_key < 0  # false
    if trigger == TRIGGER_ARGMAX:
        # The token's value is the largest (a tie counts; NaN and -inf never do).
        token = _from_order_key(token_key)
        fired = (token > -INF) & (token >= mx)
    elif (mx > -INF) & (mx < INF):
        # The largest probability, 1 / S, below p.
        total = tl.zeros([], tl.int64)
        for begin in range(0, vocab, BLOCK):
            v, inside = _values(P, d, x, vocab, t, begin, DTYPE, BLOCK)
            w, _ = _weights(v, mx)
            total += tl.sum(tl.where(inside, w, 0), 0)
        scale = (total.to(tl.float64) / FIXED_SCALE).to(tl.float32)
        fired = tl.div_rn(1.0, scale) < _as_f32(parameter)
    return fired


@triton.jit
def _snapshot(P, d, x, vocab, t, snapshot, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    """The row as the reduction at dense op `t` reads it, written at word `snapshot` of P (none:
    NO_TOKEN), for its processor's next step (mirostat's, adaptive-p's)."""
    if snapshot != NO_TOKEN:
        for begin in range(0, vocab, BLOCK):
            v, inside = _values(P, d, x, vocab, t, begin, DTYPE, BLOCK)
            i = begin + tl.arange(0, BLOCK)
            tl.store(P + snapshot + i, _bits(v).to(tl.int32, bitcast=True), mask=inside)


@triton.jit
def _value_at(P, d, x, vocab, t, token, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    """The bits of `token`'s value as the row stands at dense op `t`."""
    begin = (token // BLOCK) * BLOCK
    v, _ = _values(P, d, x, vocab, t, begin, DTYPE, BLOCK)
    i = begin + tl.arange(0, BLOCK)
    return tl.max(tl.where(i == token, _bits(v), 0), 0)


@triton.jit
def lp_bands(P, list_at, vocab, row_stride, X, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    slot = tl.load(P + list_at + tl.program_id(0))
    d = P + slot * DESC_WORDS
    x = X + tl.load(d).to(tl.int64) * row_stride
    dense = tl.load(d + 2)
    # The row's reductions in order, each over the row as it stands there: a later one reads the
    # records of those before it.
    for t in range(0, tl.load(d + 3)):
        op = dense + t * DENSE_WORDS
        code = tl.load(P + op)
        if code == OP_TRUNCATE:
            record = tl.load(P + op + 1)
            _snapshot(P, d, x, vocab, t, tl.load(P + record + 6), DTYPE, BLOCK)
            lo, hi = _resolve_band(P, d, x, vocab, t, tl.load(P + record + 2), tl.load(P + record + 3),
                                   tl.load(P + record + 4), tl.load(P + record + 5), DTYPE, BLOCK)
            tl.store(P + record, lo.to(tl.int32, bitcast=True))
            tl.store(P + record + 1, hi.to(tl.int32, bitcast=True))
            tl.debug_barrier()
        elif code == OP_FORCE_IF:
            record = tl.load(P + op + 2)
            fired = _trigger(P, d, x, vocab, t, tl.load(P + record), tl.load(P + record + 1), DTYPE, BLOCK)
            tl.store(P + record + 2, fired.to(tl.int32))
            tl.debug_barrier()
        elif code == OP_VALUE_AT:
            record = tl.load(P + op + 2)
            value = _value_at(P, d, x, vocab, t, tl.load(P + op + 1), DTYPE, BLOCK)
            tl.store(P + record, value.to(tl.int32, bitcast=True))
            tl.debug_barrier()
        elif code == OP_RESHAPE:
            # The row's largest value and (adaptive-p) its softmax's sum: `Reshape::shape`.
            record = tl.load(P + op + 1)
            _snapshot(P, d, x, vocab, t, tl.load(P + record + 6), DTYPE, BLOCK)
            mx = _largest(P, d, x, vocab, t, DTYPE, BLOCK)
            resolved = (mx > -INF) & (mx < INF)
            tl.store(P + record + 3, mx.to(tl.int32, bitcast=True))
            tl.store(P + record + 4, resolved.to(tl.int32))
            transform = tl.load(P + record)
            if resolved & (transform != SHAPE_QUADRATIC):
                total = tl.zeros([], tl.int64)
                for begin in range(0, vocab, BLOCK):
                    v, inside = _values(P, d, x, vocab, t, begin, DTYPE, BLOCK)
                    w, _ = _weights(v, mx)
                    total += tl.sum(tl.where(inside, w, 0), 0)
                # adaptive-p's S in f32, log-softmax's ln S.
                sum = total.to(tl.float64) / FIXED_SCALE
                scale = sum.to(tl.float32)
                if transform == SHAPE_LOG_SOFTMAX:
                    scale = _ln(sum).to(tl.float32)
                tl.store(P + record + 5, scale.to(tl.int32, bitcast=True))
            tl.debug_barrier()
