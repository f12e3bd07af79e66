// logits-processing: a whole step's row plans applied to a [rows, row_stride] block.
//
// Two kernels read the packed plans (built by crates/cuda/src/packed.rs, whose module docs give the
// layout, and which also holds a host emulation of both kernels that the property tests compare
// with `RowPlan::apply`):
// - lp_bands_*: one block per row that truncates; resolves each truncation of the row, in order,
//   to a band over the row as it stands there (values computed on the fly from the original row),
//   and writes the band into the packed words;
// - lp_apply_*: one block per (row, tile of TILE logits); each logit read at most once and written
//   at most once: forced rows write -inf without reading (the survivors alone are read: the forced
//   token and the tokens a Set after the last force names); rows with
//   dense ops read, evaluate and write every logit; rows with sparse ops only touch their tokens.
//
// A logit's value: untouched logits go through the dense ops in order; a touched token's program
// (its own sparse ops, each tagged with the number of dense ops before it) is merged with the
// dense ops in plan order: O(its edits + dense edits).
//
// Arithmetic is the CPU path's, bit for bit: f32 IEEE division, multiplication and addition
// (__fdiv_rn, __fmul_rn, __fadd_rn: never a reciprocal multiply, never contracted), and f16/bf16
// values widened to f32, computed, and rounded back to nearest-even after every edit, as
// `Logit::from_f32` does. The f16/bf16 rounding of NaN keeps the payload the way the `half` crate
// does.
//
// The constants (layout, op codes, rule codes) are not defined here: packed.rs generates them
// (`kernel_header`) and `kernel_source()` prepends them, so the two cannot disagree.
// Compile with: --ftz=false --prec-div=true --prec-sqrt=true --fmad=false (src/nvrtc.rs).

#ifndef OP_SCALE
#error "compile logits_processing_cuda::kernel_source(): the constants come from packed.rs"
#endif

#define TILE (THREADS * PER_THREAD)
#define RADIX_BINS (1u << RADIX_BITS)
// The band kernel's radix select gives each histogram bin a thread.
static_assert(THREADS >= RADIX_BINS, "fewer threads than radix bins");

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ float as_f(u32 w) { return __uint_as_float(w); }

struct F32 {
    typedef float Elem;
    static __device__ __forceinline__ float load(const float* p) { return *p; }
    static __device__ __forceinline__ void store(float* p, float v) { *p = v; }
    static __device__ __forceinline__ float round(float v) { return v; }
    static __device__ __forceinline__ float neg_inf_elem() { return neg_inf(); }
};

// f32 -> f16, round to nearest even (the hardware conversion); NaN keeps its sign and top payload
// bits and is made quiet, like `half::f16::from_f32`.
__device__ __forceinline__ u16 f32_to_f16_bits(float f) {
    u32 x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (u16)(((x & 0x80000000u) >> 16) | 0x7c00u | 0x0200u | ((x & 0x007fffffu) >> 13));
    }
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float f16_bits_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

struct F16 {
    typedef u16 Elem;
    static __device__ __forceinline__ float load(const u16* p) { return f16_bits_to_f32(*p); }
    static __device__ __forceinline__ void store(u16* p, float v) { *p = f32_to_f16_bits(v); }
    static __device__ __forceinline__ float round(float v) { return f16_bits_to_f32(f32_to_f16_bits(v)); }
    static __device__ __forceinline__ u16 neg_inf_elem() { return (u16)0xfc00u; }
};

// f32 -> bf16, round to nearest even, written out so that it runs on every architecture (the
// cvt.rn.bf16.f32 instruction needs sm_80) and treats NaN exactly like `half::bf16::from_f32`.
__device__ __forceinline__ u16 f32_to_bf16_bits(float f) {
    u32 x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (u16)((x >> 16) | 0x0040u);
    }
    const u32 round_bit = 0x00008000u;
    if ((x & round_bit) != 0u && (x & (3u * round_bit - 1u)) != 0u) {
        return (u16)((x >> 16) + 1u);
    }
    return (u16)(x >> 16);
}

__device__ __forceinline__ float bf16_bits_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }

struct BF16 {
    typedef u16 Elem;
    static __device__ __forceinline__ float load(const u16* p) { return bf16_bits_to_f32(*p); }
    static __device__ __forceinline__ void store(u16* p, float v) { *p = f32_to_bf16_bits(v); }
    static __device__ __forceinline__ float round(float v) { return bf16_bits_to_f32(f32_to_bf16_bits(v)); }
    static __device__ __forceinline__ u16 neg_inf_elem() { return (u16)0xff80u; }
};

// One slot's descriptor, read once per block.
struct Desc {
    u32 row, forced, dense, n_dense, touched, n_touched, bounds, truncations, survivors, n_survivors;
    __device__ __forceinline__ explicit Desc(const u32* d)
        : row(d[0]), forced(d[1]), dense(d[2]), n_dense(d[3]), touched(d[4]), n_touched(d[5]),
          bounds(d[6]), truncations(d[7]), survivors(d[8]), n_survivors(d[9]) {}
};

// `Edit::value` of dense op `op` (Scale, Force, Mask, Truncate) for the logit at `i`.
template <class T>
__device__ __forceinline__ float dense_op(const u32* P, const u32* op, u32 i, float v) {
    switch (op[0]) {
    case OP_SCALE:
        return T::round(__fdiv_rn(v, as_f(op[1])));
    case OP_FORCE_KEEP:
        return i == op[1] ? T::round(__fadd_rn(v, 0.0f)) : neg_inf();
    case OP_FORCE_SET:
        return i == op[1] ? T::round(as_f(op[2])) : neg_inf();
    case OP_MASK: {
        const u32 w = i / 32u;
        const bool allowed = w < op[2] ? ((P[op[1] + w] >> (i % 32u)) & 1u) != 0u : op[3] != 0u;
        return allowed ? v : neg_inf();
    }
    case OP_TRUNCATE: {
        const float lo = as_f(P[op[1]]), hi = as_f(P[op[1] + 1u]);
        return (v < lo || v > hi) ? neg_inf() : v;
    }
    default:
        return v;
    }
}

// `Edit::value` of a touched token's own sparse op (Ban, Bias, Penalty, Raise, Set).
template <class T>
__device__ __forceinline__ float sparse_op(u32 op, float x, float v) {
    switch (op) {
    case OP_BAN:
        return neg_inf();
    case OP_BIAS:
        return T::round(__fadd_rn(v, x));
    case OP_PENALTY:
        return T::round(v < 0.0f ? __fmul_rn(v, x) : __fdiv_rn(v, x));
    case OP_RAISE:
        // x + |x| * factor on a finite logit, two roundings; a non-finite one stays.
        return isfinite(v) ? T::round(__fadd_rn(v, __fmul_rn(fabsf(v), x))) : v;
    case OP_SET:
        return T::round(x);
    default:
        return v;
    }
}

// As a truncation sees the row (`segments`), a logit that a force since the previous truncation
// did not name is -inf at the next truncation, whatever came after the force: the CPU resolves
// each band from the plan applied up to it, and a forced plan fills the other logits. A logit that
// a Set after the force names (`set`) is not filled.
__device__ __forceinline__ float segment_end(const u32* op, u32 i, float v, bool set) {
    return (op[0] == OP_TRUNCATE && op[2] != NO_TOKEN && op[2] != i && !set) ? neg_inf() : v;
}

// The logit at `i`, of value `v` before the plan, through dense ops [0, dense_end) and, for a
// touched token (`program`: its place in the touched list, else NO_TOKEN), its own sparse ops
// before dense op `dense_end`, merged in plan order.
template <class T>
__device__ float eval(const u32* P, const Desc& d, u32 i, float v, u32 program, u32 dense_end,
                      bool segments) {
    const u32* dense = P + d.dense;
    u32 next = 0;
    bool set = false;  // whether a Set of this logit came after the last force so far
    if (program != NO_TOKEN) {
        const u32 end = P[d.bounds + program + 1u];
        for (u32 s = P[d.bounds + program]; s < end; s += SPARSE_WORDS) {
            const u32 head = P[s];
            const u32 before = head >> OP_BITS;
            if (before > dense_end) break;
            for (; next < before; ++next) {
                const u32* op = dense + next * DENSE_WORDS;
                if (segments) v = segment_end(op, i, v, set);
                if (op[0] == OP_FORCE_KEEP || op[0] == OP_FORCE_SET) set = false;
                v = dense_op<T>(P, op, i, v);
            }
            const u32 code = head & ((1u << OP_BITS) - 1u);
            if (code == OP_SET) set = true;
            v = sparse_op<T>(code, as_f(P[s + 1u]), v);
        }
    }
    for (; next < dense_end; ++next) {
        const u32* op = dense + next * DENSE_WORDS;
        if (segments) v = segment_end(op, i, v, set);
        if (op[0] == OP_FORCE_KEEP || op[0] == OP_FORCE_SET) set = false;
        v = dense_op<T>(P, op, i, v);
    }
    if (segments) v = segment_end(dense + dense_end * DENSE_WORDS, i, v, set);
    return v;
}

// The first position in P[begin, end) (sorted) whose token is >= `token`.
__device__ __forceinline__ u32 lower_bound(const u32* P, u32 begin, u32 end, u32 token) {
    while (begin < end) {
        const u32 mid = begin + (end - begin) / 2u;
        if (P[mid] < token) {
            begin = mid + 1u;
        } else {
            end = mid;
        }
    }
    return begin;
}

// Fills `map` (TILE entries, shared) with each logit's place in the touched list, or NO_TOKEN, for
// the tile at `tile_begin`, from the touched positions [lo, hi) that fall in it. Block-wide.
__device__ __forceinline__ void build_map(const u32* P, const Desc& d, u32 tile_begin, u32 lo, u32 hi,
                                          u32* map) {
    for (u32 k = threadIdx.x; k < TILE; k += THREADS) map[k] = NO_TOKEN;
    __syncthreads();
    for (u32 t = lo + threadIdx.x; t < hi; t += THREADS) map[P[d.touched + t] - tile_begin] = t;
    __syncthreads();
}

// ---------------------------------------------------------------------------------------------
// The apply kernel.

template <class T>
__device__ void apply(const u32* __restrict__ P, u32 n_slots, u32 tiles_per_row, u32 vocab,
                      u64 row_stride, typename T::Elem* __restrict__ logits) {
    __shared__ u32 map[TILE];
    const u32 slot = blockIdx.x / tiles_per_row;
    const u32 tile = blockIdx.x - slot * tiles_per_row;
    if (slot >= n_slots) return;
    const Desc d(P + (u64)slot * DESC_WORDS);
    typename T::Elem* x = logits + (u64)d.row * row_stride;
    const u32 tile_begin = tile * TILE;
    const u32 first = tile_begin + threadIdx.x;

    if (d.forced != NO_TOKEN) {
        const u32 s_end = d.survivors + d.n_survivors;
#pragma unroll
        for (u32 k = 0; k < PER_THREAD; ++k) {
            const u32 i = first + k * THREADS;
            if (i >= vocab || i == d.forced) continue;
            if (d.n_survivors != 0u) {
                const u32 at = lower_bound(P, d.survivors, s_end, i);
                if (at < s_end && P[at] == i) continue;
            }
            x[i] = T::neg_inf_elem();
        }
        // The survivors (the forced token, then the tokens a Set after the force names), each
        // read and written by the thread that owns it.
        for (u32 s = 0; s <= d.n_survivors; ++s) {
            const u32 i = s == 0u ? d.forced : P[d.survivors + s - 1u];
            if (i < tile_begin || i >= tile_begin + TILE || (i - tile_begin) % THREADS != threadIdx.x) {
                continue;
            }
            const u32 end = d.touched + d.n_touched;
            const u32 at = lower_bound(P, d.touched, end, i);
            const u32 program = at < end && P[at] == i ? at - d.touched : NO_TOKEN;
            T::store(x + i, eval<T>(P, d, i, T::load(x + i), program, d.n_dense, false));
        }
        return;
    }

    // The touched tokens that fall in this tile: usually none.
    const u32 end = d.touched + d.n_touched;
    const u32 lo = lower_bound(P, d.touched, end, tile_begin);
    const u32 hi = lower_bound(P, lo, end, tile_begin + TILE);

    if (d.n_dense == 0) {
        // Sparse edits only: read and write the touched tokens, nothing else.
        for (u32 t = lo + threadIdx.x; t < hi; t += THREADS) {
            const u32 i = P[t];
            T::store(x + i, eval<T>(P, d, i, T::load(x + i), t - d.touched, 0u, false));
        }
        return;
    }

    const bool any = lo < hi;  // the same in every thread of the block
    if (any) build_map(P, d, tile_begin, lo - d.touched, hi - d.touched, map);

    float v[PER_THREAD];
#pragma unroll
    for (u32 k = 0; k < PER_THREAD; ++k) {
        const u32 i = first + k * THREADS;
        v[k] = i < vocab ? T::load(x + i) : 0.0f;
    }
#pragma unroll
    for (u32 k = 0; k < PER_THREAD; ++k) {
        const u32 i = first + k * THREADS;
        if (i < vocab) {
            const u32 program = any ? map[i - tile_begin] : NO_TOKEN;
            T::store(x + i, eval<T>(P, d, i, v[k], program, d.n_dense, false));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The band kernel.

// The key that orders f32 as `f32::total_cmp` does (truncation/gpu_shared.rs: order_key).
__device__ __forceinline__ u32 order_key(float f) {
    const u32 bits = __float_as_uint(f);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ float from_order_key(u32 key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// truncation/gpu_shared.rs: exp, operation for operation (IEEE basic operations and fmaf only; the constants
// are the core's, by their bits).
__device__ __forceinline__ float pow2(int e) { return __uint_as_float(((u32)(e + 127)) << 23); }

__device__ float lp_exp(float x) {
    if (x != x) return x;
    if (x < EXP_MIN) return 0.0f;
    if (x > EXP_MAX) return pos_inf();
    const float n = __fsub_rn(fmaf(x, EXP_LOG2_E, EXP_SHIFTER), EXP_SHIFTER);
    float r = fmaf(n, -EXP_LN2_HI, x);
    r = fmaf(n, -EXP_LN2_LO, r);
    static_assert(EXP_POLY_LEN == 6u, "exp's polynomial has six coefficients");
    float p = EXP_POLY_0;
    p = fmaf(p, r, EXP_POLY_1);
    p = fmaf(p, r, EXP_POLY_2);
    p = fmaf(p, r, EXP_POLY_3);
    p = fmaf(p, r, EXP_POLY_4);
    p = fmaf(p, r, EXP_POLY_5);
    const float y = __fadd_rn(fmaf(p, __fmul_rn(r, r), r), 1.0f);
    const int e = (int)n;
    if (e < -126) return __fmul_rn(__fmul_rn(y, pow2(e + 64)), pow2(-64));
    if (e > 127) return __fmul_rn(__fmul_rn(y, 2.0f), pow2(e - 1));
    return __fmul_rn(y, pow2(e));
}

// truncation/gpu_shared.rs: fixed, round(v * 2^FIXED_BITS) to nearest even.
__device__ __forceinline__ u64 fixed(float v) {
    return __float2ull_rn(__fmul_rn(v, pow2((int)FIXED_BITS)));
}

__device__ __forceinline__ double as_double(u64 x) { return __ull2double_rn(x); }

// truncation/softmax.rs: Softmax (its maximum and fixed-point sums), and what the rules derive from it.
struct Softmax {
    float max;
    u64 sum, entropy_sum;
    __device__ __forceinline__ float q(float x) const { return lp_exp(__fsub_rn(x, max)); }
    // The weights `x` adds to the sum and to the entropy sum.
    __device__ __forceinline__ void weights(float x, u64& w, u64& e) const {
        w = 0ull;
        e = 0ull;
        if (x != x) return;
        const float d = __fsub_rn(x, max);
        const float q = lp_exp(d);
        if (q > 0.0f) {
            w = fixed(q);
            e = fixed(__fmul_rn(q, -d));
        }
    }
    __device__ __forceinline__ u64 weight(float x) const {
        u64 w, e;
        weights(x, w, e);
        return w;
    }
    __device__ __forceinline__ float scale() const {
        return __double2float_rn(__ddiv_rn(as_double(sum), as_double(1ull << FIXED_BITS)));
    }
    __device__ __forceinline__ float shift() const {
        return __double2float_rn(__ddiv_rn(as_double(entropy_sum), as_double(sum)));
    }
    __device__ __forceinline__ double target(float p) const { return __dmul_rn((double)p, as_double(sum)); }
    __device__ __forceinline__ float threshold(u32 rule, float parameter) const {
        if (rule == RULE_MIN_P) return parameter;
        const float by_epsilon = __fmul_rn(parameter, scale());
        if (rule == RULE_EPSILON) return by_epsilon;
        return fminf(by_epsilon, __fmul_rn(__fsqrt_rn(parameter), lp_exp(-shift())));
    }
    __device__ __forceinline__ float typical_score(float x, float shift) const {
        return fabsf(__fadd_rn(__fsub_rn(x, max), shift));
    }
};

// Calls `f(v)` for every logit of the row as it stands at dense op `t` (a truncation), tile by
// tile. Block-wide (every thread must call it).
template <class T, class F>
__device__ void for_each_value(const u32* P, const Desc& d, const typename T::Elem* x, u32 vocab,
                               u32 t, u32* map, F& f) {
    const u32 end = d.touched + d.n_touched;
    u32 lo = d.touched;
    for (u32 tile_begin = 0; tile_begin < vocab; tile_begin += TILE) {
        const u32 hi = lower_bound(P, lo, end, tile_begin + TILE);
        const bool any = lo < hi;  // the same in every thread of the block
        if (any) build_map(P, d, tile_begin, lo - d.touched, hi - d.touched, map);
#pragma unroll 1
        for (u32 k = 0; k < PER_THREAD; ++k) {
            const u32 i = tile_begin + threadIdx.x + k * THREADS;
            if (i < vocab) {
                const u32 program = any ? map[i - tile_begin] : NO_TOKEN;
                f(eval<T>(P, d, i, T::load(x + i), program, t, true));
            }
        }
        if (any) __syncthreads();  // before the next tile's map overwrites this one
        lo = hi;
    }
}

// The keys and weights of a selection (packed.rs: select_key's `key_of`): `false` when the value
// takes no part.
struct CountKey {  // every non-NaN value, weighing 1
    __device__ __forceinline__ bool operator()(float v, u32& key, u64& w) const {
        if (v != v) return false;
        key = order_key(v);
        w = 1ull;
        return true;
    }
};

struct MassKey {  // every non-NaN value, weighing its probability
    Softmax s;
    __device__ __forceinline__ bool operator()(float v, u32& key, u64& w) const {
        if (v != v) return false;
        key = order_key(v);
        w = s.weight(v);
        return true;
    }
};

struct TypicalKey {  // values neither NaN nor -inf, by falling score, weighing 1 or their mass
    Softmax s;
    float shift;
    bool by_mass;
    __device__ __forceinline__ bool operator()(float v, u32& key, u64& w) const {
        if (v != v || v == neg_inf()) return false;
        key = ~order_key(s.typical_score(v, shift));
        w = by_mass ? s.weight(v) : 1ull;
        return true;
    }
};

// Adds each value's weight, when its key starts with `prefix` (the bits in `fixed`), to the bin of
// its digit at `shift`.
template <class K>
struct Histogram {
    u64* hist;
    K key_of;
    u32 prefix, fixed, shift;
    __device__ __forceinline__ void operator()(float v) {
        u32 key;
        u64 w;
        if (!key_of(v, key, w)) return;
        if ((key & fixed) == prefix && w != 0ull) atomicAdd(&hist[(key >> shift) & (RADIX_BINS - 1u)], w);
    }
};

// The largest key at which the weights of the keys at or above it reach `target` (f64 compare):
// weighted radix select, RADIX_BITS bits a pass, most significant first (packed.rs: select_key).
// With `clamp`, the target is at most the total. Returns false when the total falls short or the
// target is not positive. Block-wide; THREADS >= RADIX_BINS.
template <class T, class K>
__device__ bool select_key(const u32* P, const Desc& d, const typename T::Elem* x, u32 vocab, u32 t,
                           u32* map, K key_of, double target, bool clamp, u32& out) {
    __shared__ u64 hist[RADIX_BINS];
    __shared__ u64 suffix[RADIX_BINS];
    __shared__ u32 chosen;
    u32 prefix = 0u;
    u64 above = 0ull;
    const u32 b = threadIdx.x;
    for (u32 pass = 0; pass < 32u / RADIX_BITS; ++pass) {
        const u32 shift = 32u - RADIX_BITS * (pass + 1u);
        const u32 fixed_bits = pass == 0u ? 0u : (0xffffffffu << (shift + RADIX_BITS));
        if (b < RADIX_BINS) hist[b] = 0ull;
        __syncthreads();
        Histogram<K> h = {hist, key_of, prefix, fixed_bits, shift};
        for_each_value<T>(P, d, x, vocab, t, map, h);
        __syncthreads();
        // Inclusive sums from the top bin down (Hillis-Steele).
        if (b < RADIX_BINS) suffix[b] = hist[b];
        __syncthreads();
        for (u32 step = 1u; step < RADIX_BINS; step *= 2u) {
            const u64 add = (b < RADIX_BINS && b + step < RADIX_BINS) ? suffix[b + step] : 0ull;
            __syncthreads();
            if (b < RADIX_BINS) suffix[b] += add;
            __syncthreads();
        }
        if (pass == 0u) {
            const u64 total = suffix[0];
            if (clamp) target = fmin(target, as_double(total));
            if (!(target > 0.0) || as_double(total) < target) return false;  // the same in every thread
        }
        // The bin where the running sum, from the top, reaches the target: one thread finds it.
        if (b < RADIX_BINS) {
            const u64 reached = above + suffix[b];
            if (as_double(reached - hist[b]) < target && as_double(reached) >= target) chosen = b;
        }
        __syncthreads();
        const u32 c = chosen;
        above += suffix[c] - hist[c];
        prefix |= c << shift;
        __syncthreads();  // every thread has read this pass's bins
    }
    out = prefix;
    return true;
}

// Per-thread reductions, then one shared atomic per thread.
struct MaxKey {
    u32 key;
    __device__ __forceinline__ void operator()(float v) {
        if (v == v && order_key(v) > key) key = order_key(v);
    }
};

struct Sums {
    Softmax s;
    u64 sum, entropy_sum;
    __device__ __forceinline__ void operator()(float v) {
        u64 w, e;
        s.weights(v, w, e);
        sum += w;
        entropy_sum += e;
    }
};

struct ThresholdMin {  // the smallest value whose q reaches the threshold
    Softmax s;
    float threshold;
    u32 key;
    __device__ __forceinline__ void operator()(float v) {
        if (v == v && s.q(v) >= threshold && order_key(v) < key) key = order_key(v);
    }
};

struct TypicalRange {  // the smallest and largest value scoring at most the cut
    TypicalKey scored;
    u32 cut, lo, hi;
    __device__ __forceinline__ void operator()(float v) {
        u32 key;
        u64 w;
        if (!scored(v, key, w) || key < cut) return;
        const u32 k = order_key(v);
        if (k < lo) lo = k;
        if (k > hi) hi = k;
    }
};

// The band of the truncation at dense op `t` (packed.rs: resolve_band). Block-wide.
template <class T>
__device__ void resolve_band(const u32* P, const Desc& d, const typename T::Elem* x, u32 vocab, u32 t,
                             u32* map, u32 rule, u32 parameter, u32 min_keep, float& lo, float& hi) {
    __shared__ u32 shared_key, shared_key2;
    __shared__ u64 shared_sum, shared_entropy;
    const u32 NEG_INF_KEY = order_key(neg_inf()), POS_INF_KEY = order_key(pos_inf());
    const CountKey count = {};
    lo = neg_inf();
    hi = pos_inf();
    u32 key;
    if (rule == RULE_TOP_K) {
        const u32 k = parameter > min_keep ? parameter : min_keep;
        lo = from_order_key(select_key<T>(P, d, x, vocab, t, map, count, (double)k, false, key) ? key
                                                                                              : NEG_INF_KEY);
        return;
    }
    // The maximum.
    if (threadIdx.x == 0) shared_key = NEG_INF_KEY;
    __syncthreads();
    MaxKey m = {NEG_INF_KEY};
    for_each_value<T>(P, d, x, vocab, t, map, m);
    atomicMax(&shared_key, m.key);
    __syncthreads();
    Softmax s = {from_order_key(shared_key), 0ull, 0ull};
    if (!(s.max > neg_inf() && s.max < pos_inf())) return;  // no distribution: keep everything
    // The fixed-point sums.
    if (threadIdx.x == 0) {
        shared_sum = 0ull;
        shared_entropy = 0ull;
    }
    __syncthreads();
    Sums sums = {s, 0ull, 0ull};
    for_each_value<T>(P, d, x, vocab, t, map, sums);
    atomicAdd(&shared_sum, sums.sum);
    atomicAdd(&shared_entropy, sums.entropy_sum);
    __syncthreads();
    s.sum = shared_sum;
    s.entropy_sum = shared_entropy;
    const float p = as_f(parameter);
    u32 lo_key;
    if (rule == RULE_TYPICAL) {
        const float shift = s.shift();
        const TypicalKey by_mass = {s, shift, true}, by_count = {s, shift, false};
        u32 mass_cut, count_cut;
        if (!select_key<T>(P, d, x, vocab, t, map, by_mass, s.target(p), false, mass_cut)) return;
        if (!select_key<T>(P, d, x, vocab, t, map, by_count, (double)min_keep, true, count_cut)) return;
        if (threadIdx.x == 0) {
            shared_key = POS_INF_KEY;
            shared_key2 = NEG_INF_KEY;
        }
        __syncthreads();
        TypicalRange range = {by_count, mass_cut < count_cut ? mass_cut : count_cut, POS_INF_KEY,
                              NEG_INF_KEY};
        for_each_value<T>(P, d, x, vocab, t, map, range);
        atomicMin(&shared_key, range.lo);
        atomicMax(&shared_key2, range.hi);
        __syncthreads();
        lo = from_order_key(shared_key);
        hi = from_order_key(shared_key2);
        return;
    }
    if (rule == RULE_TOP_P) {
        const MassKey by_mass = {s};
        if (!select_key<T>(P, d, x, vocab, t, map, by_mass, s.target(p), false, lo_key)) return;
    } else {  // min-p, epsilon, eta
        if (threadIdx.x == 0) shared_key = POS_INF_KEY;
        __syncthreads();
        ThresholdMin below = {s, s.threshold(rule, p), POS_INF_KEY};
        for_each_value<T>(P, d, x, vocab, t, map, below);
        atomicMin(&shared_key, below.key);
        __syncthreads();
        lo_key = shared_key;
    }
    const u32 kth = select_key<T>(P, d, x, vocab, t, map, count, (double)min_keep, false, key) ? key
                                                                                                 : NEG_INF_KEY;
    lo = from_order_key(lo_key < kth ? lo_key : kth);
}

template <class T>
__device__ void bands(u32* P, u32 list, u32 vocab, u64 row_stride, const typename T::Elem* logits) {
    __shared__ u32 map[TILE];
    const Desc d(P + (u64)P[list + blockIdx.x] * DESC_WORDS);
    const typename T::Elem* x = logits + (u64)d.row * row_stride;
    for (u32 t = 0; t < d.n_dense; ++t) {
        const u32* op = P + d.dense + t * DENSE_WORDS;
        if (op[0] != OP_TRUNCATE) continue;
        u32* record = P + op[1];
        float lo, hi;
        resolve_band<T>(P, d, x, vocab, t, map, record[2], record[3], record[4], lo, hi);
        __syncthreads();  // every thread has read the record and the shared results
        if (threadIdx.x == 0) {
            record[0] = __float_as_uint(lo);
            record[1] = __float_as_uint(hi);
        }
        // Later truncations of the row read this band.
        __threadfence_block();
        __syncthreads();
    }
}

// ---------------------------------------------------------------------------------------------
// Entry points.

extern "C" __global__ void __launch_bounds__(THREADS)
lp_apply_f32(const u32* __restrict__ packed, u32 n_slots, u32 tiles_per_row, u32 vocab, u64 row_stride,
             float* __restrict__ logits) {
    apply<F32>(packed, n_slots, tiles_per_row, vocab, row_stride, logits);
}

extern "C" __global__ void __launch_bounds__(THREADS)
lp_apply_f16(const u32* __restrict__ packed, u32 n_slots, u32 tiles_per_row, u32 vocab, u64 row_stride,
             u16* __restrict__ logits) {
    apply<F16>(packed, n_slots, tiles_per_row, vocab, row_stride, logits);
}

extern "C" __global__ void __launch_bounds__(THREADS)
lp_apply_bf16(const u32* __restrict__ packed, u32 n_slots, u32 tiles_per_row, u32 vocab, u64 row_stride,
              u16* __restrict__ logits) {
    apply<BF16>(packed, n_slots, tiles_per_row, vocab, row_stride, logits);
}

// `packed` is written (the bands) and read back by the same block: neither const nor restrict.
extern "C" __global__ void __launch_bounds__(THREADS)
lp_bands_f32(u32* packed, u32 list, u32 vocab, u64 row_stride, const float* logits) {
    bands<F32>(packed, list, vocab, row_stride, logits);
}

extern "C" __global__ void __launch_bounds__(THREADS)
lp_bands_f16(u32* packed, u32 list, u32 vocab, u64 row_stride, const u16* logits) {
    bands<F16>(packed, list, vocab, row_stride, logits);
}

extern "C" __global__ void __launch_bounds__(THREADS)
lp_bands_bf16(u32* packed, u32 list, u32 vocab, u64 row_stride, const u16* logits) {
    bands<BF16>(packed, list, vocab, row_stride, logits);
}
