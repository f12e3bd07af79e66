// logits-processing: one launch applies every listed row's plan to a [rows, row_stride] block.
//
// The packed buffer (built by src/packed.rs, which also holds a host emulation of this file that the
// property tests compare with `RowPlan::apply`) is an array of u32 words:
//   [slot 0 descriptor][slot 1 descriptor]...[data]
// Each descriptor is DESC_WORDS words:
//   row, forced token (NO_FORCE if none), scale_begin, scale_end, touched_begin, touched_end,
//   edit_begin, edit_end
// where the begin/end pairs are word offsets into the same buffer:
//   scales:  the temperatures of the row's Scale edits, in order (f32 bits): the dense chain;
//   touched: the sorted, distinct tokens the row's Ban/Bias edits name;
//   edits:   the row's whole edit list, EDIT_WORDS words each (kind, token, f32 bits), from which the
//            thread owning a touched (or forced) index evaluates `RowPlan::value_at` on the original.
//
// Grid: one block per (slot, tile of TILE logits), flattened into blockIdx.x. Each logit is read at
// most once and written at most once: forced rows write -inf without reading (the survivor alone is
// read); rows with no Scale touch only their touched tokens.
//
// Arithmetic is the CPU path's, bit for bit: f32 IEEE division and addition (__fdiv_rn, __fadd_rn:
// never a reciprocal multiply, never contracted), and f16/bf16 values widened to f32, computed, and
// rounded back to nearest-even after every edit, as `Logit::from_f32` does. The f16/bf16 rounding
// of NaN keeps the payload the way the `half` crate does.
//
// Compile with: --ftz=false --prec-div=true --prec-sqrt=true --fmad=false (src/nvrtc.rs).

#define THREADS 256
#define PER_THREAD 4
#define TILE (THREADS * PER_THREAD)
#define DESC_WORDS 8
#define EDIT_WORDS 3
#define NO_FORCE 0xFFFFFFFFu

#define EDIT_SCALE 0u
#define EDIT_FORCE_KEEP 1u
#define EDIT_FORCE_SET 2u
#define EDIT_BAN 3u
#define EDIT_BIAS 4u

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

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

// `RowPlan::value_at`: the row's edits folded over the logit at `index`, from its original value.
template <class T>
__device__ float value_at(const u32* __restrict__ packed, u32 begin, u32 end, u32 index, float v) {
    for (u32 e = begin; e < end; e += EDIT_WORDS) {
        const u32 kind = packed[e];
        const u32 token = packed[e + 1];
        const float x = __uint_as_float(packed[e + 2]);
        if (kind == EDIT_SCALE) {
            v = T::round(__fdiv_rn(v, x));
        } else if (kind == EDIT_FORCE_KEEP) {
            v = token == index ? T::round(__fadd_rn(v, 0.0f)) : neg_inf();
        } else if (kind == EDIT_FORCE_SET) {
            v = token == index ? T::round(x) : neg_inf();
        } else if (kind == EDIT_BAN) {
            if (token == index) v = neg_inf();
        } else if (kind == EDIT_BIAS) {
            if (token == index) v = T::round(__fadd_rn(v, x));
        }
    }
    return v;
}

// The first position in packed[begin, end) (sorted) whose token is >= `token`.
__device__ __forceinline__ u32 lower_bound(const u32* __restrict__ packed, u32 begin, u32 end, u32 token) {
    while (begin < end) {
        const u32 mid = begin + (end - begin) / 2;
        if (packed[mid] < token) {
            begin = mid + 1;
        } else {
            end = mid;
        }
    }
    return begin;
}

template <class T>
__device__ void apply(const u32* __restrict__ packed, u32 n_slots, u32 tiles_per_row, u32 vocab,
                      u64 row_stride, typename T::Elem* __restrict__ logits) {
    const u32 slot = blockIdx.x / tiles_per_row;
    const u32 tile = blockIdx.x - slot * tiles_per_row;
    if (slot >= n_slots) return;
    const u32* d = packed + (u64)slot * DESC_WORDS;
    const u32 row = d[0];
    const u32 forced = d[1];
    const u32 scale_begin = d[2], scale_end = d[3];
    const u32 touched_begin = d[4], touched_end = d[5];
    const u32 edit_begin = d[6], edit_end = d[7];
    typename T::Elem* x = logits + (u64)row * row_stride;
    const u32 tile_begin = tile * TILE;
    const u32 first = tile_begin + threadIdx.x;

    if (forced != NO_FORCE) {
#pragma unroll
        for (u32 k = 0; k < PER_THREAD; ++k) {
            const u32 i = first + k * THREADS;
            if (i < vocab) {
                if (i == forced) {
                    T::store(x + i, value_at<T>(packed, edit_begin, edit_end, i, T::load(x + i)));
                } else {
                    x[i] = T::neg_inf_elem();
                }
            }
        }
        return;
    }

    // The touched tokens that fall in this tile: usually none.
    u32 lo = touched_begin, hi = touched_begin;
    if (touched_begin < touched_end) {
        lo = lower_bound(packed, touched_begin, touched_end, tile_begin);
        hi = lower_bound(packed, lo, touched_end, tile_begin + TILE);
    }

    if (scale_begin == scale_end) {
        // Sparse edits only: read and write the touched tokens, nothing else.
        for (u32 t = lo + threadIdx.x; t < hi; t += THREADS) {
            const u32 i = packed[t];
            T::store(x + i, value_at<T>(packed, edit_begin, edit_end, i, T::load(x + i)));
        }
        return;
    }

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
            float r = v[k];
            bool touched = false;
            if (lo < hi) {
                const u32 at = lower_bound(packed, lo, hi, i);
                touched = at < hi && packed[at] == i;
            }
            if (touched) {
                r = value_at<T>(packed, edit_begin, edit_end, i, r);
            } else {
                for (u32 s = scale_begin; s < scale_end; ++s) {
                    r = T::round(__fdiv_rn(r, __uint_as_float(packed[s])));
                }
            }
            T::store(x + i, r);
        }
    }
}

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
