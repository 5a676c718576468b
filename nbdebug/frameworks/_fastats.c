/*
 * nbdebug.frameworks._fastats -- single-pass tensor statistics kernel.
 *
 * Plain CPython extension (only Python.h plus compiler intrinsics headers; no torch/numpy headers).
 *
 *   reduce(ptr, numel, dtype, out_ptr) -> None
 *   read_npy_stats(paths, out) -> list   (the statistics of many small .npy files, read in one call)
 *   slot: the capture core's Recording.slot, a method (see _recorder.c, included below)
 *
 * reads `numel` contiguous elements of `dtype` at address `ptr` and writes 9 float64 values at
 * `out_ptr`:  [max, min, sum, abs_sum, sq_sum, zero_count, nan_count, pos_inf_count, neg_inf_count]
 *
 * Semantics equal numpy on the data converted to float64: max/min are NaN when any NaN is present,
 * sums are accumulated in double (NaN/Inf propagate naturally), zero_count counts +0 and -0.
 * numel == 0 gives max = min = NaN and zero sums/counts.
 *
 * Design: the data is processed in blocks of BLOCK elements.  A vectorised "fast" block kernel
 * computes max/min/sum/abs_sum/sq_sum/zero_count assuming every value is finite.  If the block's
 * abs_sum comes out non-finite the block contains NaN/Inf (or, for float64, values whose absolute
 * sum overflows); only then is a cheap counting pass run over the (cache-resident) block to get the
 * NaN/+Inf/-Inf counts.  The sums of the fast pass are already correct in that case (NaN and Inf
 * propagate exactly as in numpy), and max/min only matter when no NaN is present, where the
 * vector max/min instructions are exact (they order +-Inf correctly).
 *
 * x86-64 builds (GCC/Clang) carry AVX-512 and AVX2 versions of the float kernels selected at import
 * time with __builtin_cpu_supports; everything else uses portable C.  No -march flags are needed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _WIN32
#include <io.h>
#else
#include <unistd.h>
#endif

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) && \
    !defined(FASTATS_NO_SIMD)
#define FASTATS_X86 1
#include <cpuid.h>
#include <immintrin.h>
#define FASTATS_AVX2 __attribute__((target("avx2,fma,f16c")))
#define FASTATS_AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")))
#else
#define FASTATS_X86 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define FASTATS_INLINE static inline __attribute__((always_inline))
#else
#define FASTATS_INLINE static __inline
#endif

enum {
    DT_FLOAT32 = 0,
    DT_FLOAT64 = 1,
    DT_FLOAT16 = 2,
    DT_BFLOAT16 = 3,
    DT_INT8 = 4,
    DT_UINT8 = 5,
    DT_INT16 = 6,
    DT_INT32 = 7,
    DT_INT64 = 8,
    DT_BOOL = 9,
    DT_COUNT = 10
};

static const size_t ELSIZE[DT_COUNT] = {4, 8, 2, 2, 1, 1, 2, 4, 8, 1};

/* Elements per block.  Small enough that a block stays in L1/L2 for the rare re-scan. */
#define BLOCK 4096
/* Release the GIL above this many elements. */
#define GIL_RELEASE_NUMEL 32768

typedef struct {
    double max, min, sum, asum, sq;
    int64_t zero;
} blk_t;

typedef struct {
    double max, min, sum, asum, sq;
    int64_t zero, nan, pinf, ninf;
} stats_t;

typedef void (*blk_fn)(const char *p, size_t n, blk_t *r);

/* ------------------------------------------------------------------------------------------ */
/* scalar element loaders (memcpy: safe for any alignment, compiles to a plain load)           */

FASTATS_INLINE uint16_t ld_u16(const char *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

FASTATS_INLINE uint32_t ld_u32(const char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

FASTATS_INLINE float bits_to_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

FASTATS_INLINE uint32_t f32_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* IEEE binary16 -> binary32, exact, integer-only for normals/Inf/NaN so it does not depend on the
 * FTZ/DAZ state (subnormal halves become normal floats: m * 2^-24 is exact). */
FASTATS_INLINE float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = h & 0x7c00u, m = h & 0x03ffu;
    if (e == 0x7c00u) return bits_to_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) return bits_to_f32(sign | f32_to_bits((float)m * 5.9604644775390625e-08f));
    return bits_to_f32(sign | ((((uint32_t)h & 0x7fffu) << 13) + ((127u - 15u) << 23)));
}

FASTATS_INLINE float bf16_to_f32(uint16_t h) { return bits_to_f32((uint32_t)h << 16); }

FASTATS_INLINE double ld_f32(const char *p) {
    float f;
    memcpy(&f, p, 4);
    return (double)f;
}
FASTATS_INLINE double ld_f64(const char *p) {
    double d;
    memcpy(&d, p, 8);
    return d;
}
FASTATS_INLINE double ld_f16(const char *p) { return (double)f16_to_f32(ld_u16(p)); }
FASTATS_INLINE double ld_bf16(const char *p) { return (double)bf16_to_f32(ld_u16(p)); }

/* ------------------------------------------------------------------------------------------ */
/* portable block kernels (fallback on every platform, also used for tails)                    */

/* Float-like types: 4 independent accumulator chains; values assumed finite (see header). */
#define GENERIC_FLOAT_KERNEL(NAME, ES, LOAD)                                                    \
    static void NAME(const char *p, size_t n, blk_t *r) {                                       \
        double s[4] = {0, 0, 0, 0}, a[4] = {0, 0, 0, 0}, q[4] = {0, 0, 0, 0};                   \
        double mx = -INFINITY, mn = INFINITY;                                                   \
        int64_t z = 0;                                                                          \
        size_t i = 0;                                                                           \
        for (; i + 4 <= n; i += 4) {                                                            \
            for (size_t k = 0; k < 4; k++) {                                                    \
                double v = LOAD(p + (i + k) * (ES));                                            \
                s[k] += v;                                                                      \
                a[k] += fabs(v);                                                                \
                q[k] += v * v;                                                                  \
                z += (v == 0.0);                                                                \
                mx = v > mx ? v : mx;                                                           \
                mn = v < mn ? v : mn;                                                           \
            }                                                                                   \
        }                                                                                       \
        for (; i < n; i++) {                                                                    \
            double v = LOAD(p + i * (ES));                                                      \
            s[0] += v;                                                                          \
            a[0] += fabs(v);                                                                    \
            q[0] += v * v;                                                                      \
            z += (v == 0.0);                                                                    \
            mx = v > mx ? v : mx;                                                               \
            mn = v < mn ? v : mn;                                                               \
        }                                                                                       \
        r->sum = (s[0] + s[1]) + (s[2] + s[3]);                                                 \
        r->asum = (a[0] + a[1]) + (a[2] + a[3]);                                                \
        r->sq = (q[0] + q[1]) + (q[2] + q[3]);                                                  \
        r->max = mx;                                                                            \
        r->min = mn;                                                                            \
        r->zero = z;                                                                            \
    }

GENERIC_FLOAT_KERNEL(gen_f32, 4, ld_f32)
GENERIC_FLOAT_KERNEL(gen_f64, 8, ld_f64)
GENERIC_FLOAT_KERNEL(gen_f16, 2, ld_f16)
GENERIC_FLOAT_KERNEL(gen_bf16, 2, ld_bf16)

/* Small integers: exact integer accumulation (a block has <= BLOCK = 4096 elements, so int32 sums
 * cannot overflow; int16 squares need int64).  Integer reductions auto-vectorise at -O3; an AVX2
 * instance is compiled too. */
#define SMALL_INT_KERNEL(NAME, ATTR, CTYPE, XFORM, SQT)                                         \
    static ATTR void NAME(const char *p, size_t n, blk_t *r) {                                  \
        int32_t s = 0, a = 0, z = 0;                                                            \
        SQT q = 0;                                                                              \
        int32_t mx = INT32_MIN, mn = INT32_MAX;                                                 \
        for (size_t i = 0; i < n; i++) {                                                        \
            CTYPE raw;                                                                          \
            memcpy(&raw, p + i * sizeof(CTYPE), sizeof(CTYPE));                                 \
            int32_t v = XFORM(raw);                                                             \
            s += v;                                                                             \
            a += v < 0 ? -v : v;                                                                \
            q += (SQT)v * (SQT)v;                                                               \
            z += (v == 0);                                                                      \
            mx = v > mx ? v : mx;                                                               \
            mn = v < mn ? v : mn;                                                               \
        }                                                                                       \
        r->sum = (double)s;                                                                     \
        r->asum = (double)a;                                                                    \
        r->sq = (double)q;                                                                      \
        r->max = n ? (double)mx : -INFINITY;                                                    \
        r->min = n ? (double)mn : INFINITY;                                                     \
        r->zero = z;                                                                            \
    }

#define XF_ID(x) ((int32_t)(x))
#define XF_BOOL(x) ((int32_t)((x) != 0))
#define SMALL_INT_KERNELS(PFX, ATTR)                                                            \
    SMALL_INT_KERNEL(PFX##_i8, ATTR, int8_t, XF_ID, int32_t)                                    \
    SMALL_INT_KERNEL(PFX##_u8, ATTR, uint8_t, XF_ID, int32_t)                                   \
    SMALL_INT_KERNEL(PFX##_i16, ATTR, int16_t, XF_ID, int64_t)                                  \
    SMALL_INT_KERNEL(PFX##_bool, ATTR, uint8_t, XF_BOOL, int32_t)

#define NO_ATTR
SMALL_INT_KERNELS(gen, NO_ATTR)

/* int32: exact int64 sum/abs_sum (|v| <= 2^31, BLOCK elements), double sq_sum. */
static void gen_i32(const char *p, size_t n, blk_t *r) {
    int64_t s = 0, a = 0, z = 0;
    double q[4] = {0, 0, 0, 0};
    int32_t mx = INT32_MIN, mn = INT32_MAX;
    for (size_t i = 0; i < n; i++) {
        int32_t v;
        memcpy(&v, p + i * 4, 4);
        int64_t w = v;
        s += w;
        a += w < 0 ? -w : w;
        z += (v == 0);
        mx = v > mx ? v : mx;
        mn = v < mn ? v : mn;
        q[i & 3] += (double)w * (double)w;
    }
    r->sum = (double)s;
    r->asum = (double)a;
    r->sq = (q[0] + q[1]) + (q[2] + q[3]);
    r->max = n ? (double)mx : -INFINITY;
    r->min = n ? (double)mn : INFINITY;
    r->zero = z;
}

/* int64: numpy converts to float64 first, so accumulate the converted values in double. */
static void gen_i64(const char *p, size_t n, blk_t *r) {
    double s[4] = {0, 0, 0, 0}, a[4] = {0, 0, 0, 0}, q[4] = {0, 0, 0, 0};
    int64_t z = 0, mx = INT64_MIN, mn = INT64_MAX;
    for (size_t i = 0; i < n; i++) {
        int64_t v;
        memcpy(&v, p + i * 8, 8);
        double d = (double)v;
        s[i & 3] += d;
        a[i & 3] += fabs(d);
        q[i & 3] += d * d;
        z += (v == 0);
        mx = v > mx ? v : mx;
        mn = v < mn ? v : mn;
    }
    r->sum = (s[0] + s[1]) + (s[2] + s[3]);
    r->asum = (a[0] + a[1]) + (a[2] + a[3]);
    r->sq = (q[0] + q[1]) + (q[2] + q[3]);
    r->max = n ? (double)mx : -INFINITY;
    r->min = n ? (double)mn : INFINITY;
    r->zero = z;
}

/* ------------------------------------------------------------------------------------------ */
/* NaN / Inf counting pass (only run on blocks whose fast abs_sum is not finite).              */
/* Bit tests on the raw encoding: integer-only, vectorises, independent of FP modes.           */

#define COUNT_NONFINITE(NAME, ATTR)                                                             \
    static ATTR void NAME(const char *p, size_t n, int dt, stats_t *s) {                        \
        int32_t nan = 0, pinf = 0, ninf = 0; /* n <= BLOCK */                                   \
        size_t i;                                                                               \
        switch (dt) {                                                                           \
        case DT_FLOAT32:                                                                        \
            for (i = 0; i < n; i++) {                                                           \
                uint32_t u = ld_u32(p + 4 * i);                                                 \
                nan += (u & 0x7fffffffu) > 0x7f800000u;                                         \
                pinf += u == 0x7f800000u;                                                       \
                ninf += u == 0xff800000u;                                                       \
            }                                                                                   \
            break;                                                                              \
        case DT_FLOAT64:                                                                        \
            for (i = 0; i < n; i++) {                                                           \
                uint64_t u;                                                                     \
                memcpy(&u, p + 8 * i, 8);                                                       \
                nan += (u & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;                     \
                pinf += u == 0x7ff0000000000000ull;                                             \
                ninf += u == 0xfff0000000000000ull;                                             \
            }                                                                                   \
            break;                                                                              \
        case DT_FLOAT16:                                                                        \
            for (i = 0; i < n; i++) {                                                           \
                uint16_t u = ld_u16(p + 2 * i);                                                 \
                nan += (u & 0x7fffu) > 0x7c00u;                                                 \
                pinf += u == 0x7c00u;                                                           \
                ninf += u == 0xfc00u;                                                           \
            }                                                                                   \
            break;                                                                              \
        case DT_BFLOAT16:                                                                       \
            for (i = 0; i < n; i++) {                                                           \
                uint16_t u = ld_u16(p + 2 * i);                                                 \
                nan += (u & 0x7fffu) > 0x7f80u;                                                 \
                pinf += u == 0x7f80u;                                                           \
                ninf += u == 0xff80u;                                                           \
            }                                                                                   \
            break;                                                                              \
        default:                                                                                \
            break;                                                                              \
        }                                                                                       \
        s->nan += nan;                                                                          \
        s->pinf += pinf;                                                                        \
        s->ninf += ninf;                                                                        \
    }

COUNT_NONFINITE(gen_count_nonfinite, NO_ATTR)

/* ------------------------------------------------------------------------------------------ */
/* x86 SIMD kernels                                                                             */

#if FASTATS_X86

/* ---- AVX2 ---------------------------------------------------------------------------------- */

/* Shared body for float-source types.  LOADX(i) -> __m256 of 8 floats at element i;
 * LO(x, i) / HI(x, i) -> __m128 halves of x (f32 reloads them from memory so the conversion can
 * take a memory operand).  TAIL is the portable kernel used for the < 16 leftover elements. */
#define AVX2_FLOAT_KERNEL(NAME, LOADX, LO, HI, TAIL, ES)                                        \
    static FASTATS_AVX2 void NAME(const char *p, size_t n, blk_t *r) {                          \
        const __m256 zero = _mm256_setzero_ps();                                                \
        const __m256d absm = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));     \
        __m256 mx = _mm256_set1_ps(-INFINITY), mn = _mm256_set1_ps(INFINITY);                   \
        __m256d s = _mm256_setzero_pd(), a = s, q0 = s;                                          \
        __m256i z = _mm256_setzero_si256();                                                     \
        size_t i = 0;                                                                           \
        /* 16 elements per step; every loop-carried chain gets one op per step (16 ymm regs). */ \
        for (; i + 16 <= n; i += 16) {                                                          \
            __m256 x0 = LOADX(i), x1 = LOADX(i + 8);                                            \
            mx = _mm256_max_ps(_mm256_max_ps(x0, x1), mx);                                      \
            mn = _mm256_min_ps(_mm256_min_ps(x0, x1), mn);                                      \
            __m256 e0 = _mm256_cmp_ps(x0, zero, _CMP_EQ_OQ);                                    \
            __m256 e1 = _mm256_cmp_ps(x1, zero, _CMP_EQ_OQ);                                    \
            z = _mm256_add_epi32(z, _mm256_add_epi32(_mm256_castps_si256(e0),                   \
                                                     _mm256_castps_si256(e1)));                 \
            __m256d d0 = _mm256_cvtps_pd(LO(x0, i)), d1 = _mm256_cvtps_pd(HI(x0, i));           \
            __m256d d2 = _mm256_cvtps_pd(LO(x1, i + 8)), d3 = _mm256_cvtps_pd(HI(x1, i + 8));   \
            s = _mm256_add_pd(s, _mm256_add_pd(_mm256_add_pd(d0, d1), _mm256_add_pd(d2, d3)));  \
            a = _mm256_add_pd(a, _mm256_add_pd(_mm256_add_pd(_mm256_and_pd(d0, absm),           \
                                                             _mm256_and_pd(d1, absm)),          \
                                               _mm256_add_pd(_mm256_and_pd(d2, absm),           \
                                                             _mm256_and_pd(d3, absm))));        \
            q0 = _mm256_add_pd(q0, _mm256_add_pd(_mm256_fmadd_pd(d1, d1, _mm256_mul_pd(d0, d0)),     \
                                                 _mm256_fmadd_pd(d3, d3, _mm256_mul_pd(d2, d2))));   \
        }                                                                                       \
        float fmx[8], fmn[8];                                                                   \
        double ds[4], da[4], dq[4];                                                             \
        int32_t iz[8];                                                                          \
        _mm256_storeu_ps(fmx, mx);                                                              \
        _mm256_storeu_ps(fmn, mn);                                                              \
        _mm256_storeu_pd(ds, s);                                                                \
        _mm256_storeu_pd(da, a);                                                                \
        _mm256_storeu_pd(dq, q0);                                                               \
        _mm256_storeu_si256((__m256i *)iz, z);                                                  \
        blk_t t;                                                                                \
        TAIL(p + i * (ES), n - i, &t);                                                          \
        double fmax_ = t.max, fmin_ = t.min;                                                    \
        int64_t zc = t.zero;                                                                    \
        for (int k = 0; k < 8; k++) {                                                           \
            fmax_ = fmx[k] > fmax_ ? fmx[k] : fmax_;                                            \
            fmin_ = fmn[k] < fmin_ ? fmn[k] : fmin_;                                            \
            zc -= iz[k];                                                                        \
        }                                                                                       \
        r->sum = ((ds[0] + ds[1]) + (ds[2] + ds[3])) + t.sum;                                   \
        r->asum = ((da[0] + da[1]) + (da[2] + da[3])) + t.asum;                                 \
        r->sq = ((dq[0] + dq[1]) + (dq[2] + dq[3])) + t.sq;                                     \
        r->max = fmax_;                                                                         \
        r->min = fmin_;                                                                         \
        r->zero = zc;                                                                           \
    }

#define F32_LOADX(i) _mm256_loadu_ps((const float *)p + (i))
#define F32_LO(x, i) _mm_loadu_ps((const float *)p + (i))
#define F32_HI(x, i) _mm_loadu_ps((const float *)p + (i) + 4)
#define X_LO(x, i) _mm256_castps256_ps128(x)
#define X_HI(x, i) _mm256_extractf128_ps((x), 1)
#define F16_LOADX(i) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * (i))))
#define BF16_LOADX(i)                                                                           \
    _mm256_castsi256_ps(_mm256_slli_epi32(                                                      \
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 2 * (i)))), 16))

AVX2_FLOAT_KERNEL(avx2_f32, F32_LOADX, F32_LO, F32_HI, gen_f32, 4)
AVX2_FLOAT_KERNEL(avx2_f16, F16_LOADX, X_LO, X_HI, gen_f16, 2)
AVX2_FLOAT_KERNEL(avx2_bf16, BF16_LOADX, X_LO, X_HI, gen_bf16, 2)

/* Double-lane kernel: LOADD(i) -> __m256d of 4 values at element i converted to double. */
#define AVX2_DOUBLE_KERNEL(NAME, LOADD, TAIL, ES)                                               \
    static FASTATS_AVX2 void NAME(const char *p, size_t n, blk_t *r) {                          \
        const __m256d zero = _mm256_setzero_pd();                                               \
        const __m256d absm = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));     \
        __m256d mx = _mm256_set1_pd(-INFINITY), mn = _mm256_set1_pd(INFINITY);                  \
        __m256d s0 = zero, s1 = zero, a0 = zero, a1 = zero, q0 = zero, q1 = zero;               \
        __m256i z = _mm256_setzero_si256();                                                     \
        size_t i = 0;                                                                           \
        for (; i + 8 <= n; i += 8) {                                                            \
            __m256d x0 = LOADD(i), x1 = LOADD(i + 4);                                           \
            mx = _mm256_max_pd(_mm256_max_pd(x0, x1), mx);                                      \
            mn = _mm256_min_pd(_mm256_min_pd(x0, x1), mn);                                      \
            __m256d e0 = _mm256_cmp_pd(x0, zero, _CMP_EQ_OQ);                                   \
            __m256d e1 = _mm256_cmp_pd(x1, zero, _CMP_EQ_OQ);                                   \
            z = _mm256_add_epi64(z, _mm256_add_epi64(_mm256_castpd_si256(e0),                   \
                                                     _mm256_castpd_si256(e1)));                 \
            s0 = _mm256_add_pd(s0, x0);                                                         \
            s1 = _mm256_add_pd(s1, x1);                                                         \
            a0 = _mm256_add_pd(a0, _mm256_and_pd(x0, absm));                                    \
            a1 = _mm256_add_pd(a1, _mm256_and_pd(x1, absm));                                    \
            q0 = _mm256_fmadd_pd(x0, x0, q0);                                                   \
            q1 = _mm256_fmadd_pd(x1, x1, q1);                                                   \
        }                                                                                       \
        s0 = _mm256_add_pd(s0, s1);                                                             \
        a0 = _mm256_add_pd(a0, a1);                                                             \
        q0 = _mm256_add_pd(q0, q1);                                                             \
        double dmx[4], dmn[4], ds[4], da[4], dq[4];                                             \
        int64_t iz[4];                                                                          \
        _mm256_storeu_pd(dmx, mx);                                                              \
        _mm256_storeu_pd(dmn, mn);                                                              \
        _mm256_storeu_pd(ds, s0);                                                               \
        _mm256_storeu_pd(da, a0);                                                               \
        _mm256_storeu_pd(dq, q0);                                                               \
        _mm256_storeu_si256((__m256i *)iz, z);                                                  \
        blk_t t;                                                                                \
        TAIL(p + i * (ES), n - i, &t);                                                          \
        double fmax_ = t.max, fmin_ = t.min;                                                    \
        int64_t zc = t.zero;                                                                    \
        for (int k = 0; k < 4; k++) {                                                           \
            fmax_ = dmx[k] > fmax_ ? dmx[k] : fmax_;                                            \
            fmin_ = dmn[k] < fmin_ ? dmn[k] : fmin_;                                            \
            zc -= iz[k];                                                                        \
        }                                                                                       \
        r->sum = ((ds[0] + ds[1]) + (ds[2] + ds[3])) + t.sum;                                   \
        r->asum = ((da[0] + da[1]) + (da[2] + da[3])) + t.asum;                                 \
        r->sq = ((dq[0] + dq[1]) + (dq[2] + dq[3])) + t.sq;                                     \
        r->max = fmax_;                                                                         \
        r->min = fmin_;                                                                         \
        r->zero = zc;                                                                           \
    }

#define F64_LOADD(i) _mm256_loadu_pd((const double *)p + (i))
#define I32_LOADD(i) _mm256_cvtepi32_pd(_mm_loadu_si128((const __m128i *)(p + 4 * (i))))
AVX2_DOUBLE_KERNEL(avx2_f64, F64_LOADD, gen_f64, 8)
AVX2_DOUBLE_KERNEL(avx2_i32, I32_LOADD, gen_i32, 4)

SMALL_INT_KERNELS(avx2, FASTATS_AVX2)
COUNT_NONFINITE(avx2_count_nonfinite, FASTATS_AVX2)

/* ---- AVX-512 ------------------------------------------------------------------------------- */

/* LOADX(i) -> __m512 of 16 floats; LO/HI -> __m256 halves. */
#define AVX512_FLOAT_KERNEL(NAME, LOADX, LO, HI, TAIL, ES)                                      \
    static FASTATS_AVX512 void NAME(const char *p, size_t n, blk_t *r) {                        \
        const __m512 zero = _mm512_setzero_ps();                                                \
        const __m512i one = _mm512_set1_epi32(1);                                               \
        __m512 mx0 = _mm512_set1_ps(-INFINITY), mn0 = _mm512_set1_ps(INFINITY);                 \
        __m512 mx1 = mx0, mn1 = mn0;                                                            \
        __m512d s0 = _mm512_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;                            \
        __m512d a0 = s0, a1 = s0, a2 = s0, a3 = s0, q0 = s0, q1 = s0, q2 = s0, q3 = s0;         \
        __m512i z0 = _mm512_setzero_si512(), z1 = z0;                                           \
        size_t i = 0;                                                                           \
        for (; i + 32 <= n; i += 32) {                                                          \
            __m512 x0 = LOADX(i), x1 = LOADX(i + 16);                                           \
            mx0 = _mm512_max_ps(x0, mx0);                                                       \
            mn0 = _mm512_min_ps(x0, mn0);                                                       \
            mx1 = _mm512_max_ps(x1, mx1);                                                       \
            mn1 = _mm512_min_ps(x1, mn1);                                                       \
            z0 = _mm512_mask_add_epi32(z0, _mm512_cmp_ps_mask(x0, zero, _CMP_EQ_OQ), z0, one);  \
            z1 = _mm512_mask_add_epi32(z1, _mm512_cmp_ps_mask(x1, zero, _CMP_EQ_OQ), z1, one);  \
            __m512d d0 = _mm512_cvtps_pd(LO(x0, i)), d1 = _mm512_cvtps_pd(HI(x0, i));           \
            __m512d d2 = _mm512_cvtps_pd(LO(x1, i + 16)), d3 = _mm512_cvtps_pd(HI(x1, i + 16)); \
            s0 = _mm512_add_pd(s0, d0);                                                         \
            s1 = _mm512_add_pd(s1, d1);                                                         \
            s2 = _mm512_add_pd(s2, d2);                                                         \
            s3 = _mm512_add_pd(s3, d3);                                                         \
            a0 = _mm512_add_pd(a0, _mm512_abs_pd(d0));                                          \
            a1 = _mm512_add_pd(a1, _mm512_abs_pd(d1));                                          \
            a2 = _mm512_add_pd(a2, _mm512_abs_pd(d2));                                          \
            a3 = _mm512_add_pd(a3, _mm512_abs_pd(d3));                                          \
            q0 = _mm512_fmadd_pd(d0, d0, q0);                                                   \
            q1 = _mm512_fmadd_pd(d1, d1, q1);                                                   \
            q2 = _mm512_fmadd_pd(d2, d2, q2);                                                   \
            q3 = _mm512_fmadd_pd(d3, d3, q3);                                                   \
        }                                                                                       \
        blk_t t;                                                                                \
        TAIL(p + i * (ES), n - i, &t);                                                          \
        mx0 = _mm512_max_ps(mx0, mx1);                                                          \
        mn0 = _mm512_min_ps(mn0, mn1);                                                          \
        double mx = _mm512_reduce_max_ps(mx0), mn = _mm512_reduce_min_ps(mn0);                  \
        r->max = t.max > mx ? t.max : mx;                                                       \
        r->min = t.min < mn ? t.min : mn;                                                       \
        r->sum = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(s0, s1), _mm512_add_pd(s2, s3))) \
                 + t.sum;                                                                       \
        r->asum =                                                                               \
            _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3))) +  \
            t.asum;                                                                             \
        r->sq = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(q0, q1), _mm512_add_pd(q2, q3))) \
                + t.sq;                                                                         \
        r->zero = (int64_t)_mm512_reduce_add_epi32(_mm512_add_epi32(z0, z1)) + t.zero;          \
    }

#define F32_LOADX512(i) _mm512_loadu_ps((const float *)p + (i))
#define F32_LO512(x, i) _mm256_loadu_ps((const float *)p + (i))
#define F32_HI512(x, i) _mm256_loadu_ps((const float *)p + (i) + 8)
#define X_LO512(x, i) _mm512_castps512_ps256(x)
#define X_HI512(x, i) _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))
#define F16_LOADX512(i) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 2 * (i))))
#define BF16_LOADX512(i)                                                                        \
    _mm512_castsi512_ps(_mm512_slli_epi32(                                                      \
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p + 2 * (i)))), 16))

AVX512_FLOAT_KERNEL(avx512_f32, F32_LOADX512, F32_LO512, F32_HI512, avx2_f32, 4)
AVX512_FLOAT_KERNEL(avx512_f16, F16_LOADX512, X_LO512, X_HI512, avx2_f16, 2)
AVX512_FLOAT_KERNEL(avx512_bf16, BF16_LOADX512, X_LO512, X_HI512, avx2_bf16, 2)

#define AVX512_DOUBLE_KERNEL(NAME, LOADD, TAIL, ES)                                             \
    static FASTATS_AVX512 void NAME(const char *p, size_t n, blk_t *r) {                        \
        const __m512d zero = _mm512_setzero_pd();                                               \
        const __m512i one = _mm512_set1_epi64(1);                                               \
        __m512d mx0 = _mm512_set1_pd(-INFINITY), mn0 = _mm512_set1_pd(INFINITY);                \
        __m512d mx1 = mx0, mn1 = mn0;                                                           \
        __m512d s0 = zero, s1 = zero, a0 = zero, a1 = zero, q0 = zero, q1 = zero;               \
        __m512i z0 = _mm512_setzero_si512();                                                    \
        size_t i = 0;                                                                           \
        for (; i + 16 <= n; i += 16) {                                                          \
            __m512d x0 = LOADD(i), x1 = LOADD(i + 8);                                           \
            mx0 = _mm512_max_pd(x0, mx0);                                                       \
            mn0 = _mm512_min_pd(x0, mn0);                                                       \
            mx1 = _mm512_max_pd(x1, mx1);                                                       \
            mn1 = _mm512_min_pd(x1, mn1);                                                       \
            z0 = _mm512_mask_add_epi64(z0, _mm512_cmp_pd_mask(x0, zero, _CMP_EQ_OQ), z0, one);  \
            z0 = _mm512_mask_add_epi64(z0, _mm512_cmp_pd_mask(x1, zero, _CMP_EQ_OQ), z0, one);  \
            s0 = _mm512_add_pd(s0, x0);                                                         \
            s1 = _mm512_add_pd(s1, x1);                                                         \
            a0 = _mm512_add_pd(a0, _mm512_abs_pd(x0));                                          \
            a1 = _mm512_add_pd(a1, _mm512_abs_pd(x1));                                          \
            q0 = _mm512_fmadd_pd(x0, x0, q0);                                                   \
            q1 = _mm512_fmadd_pd(x1, x1, q1);                                                   \
        }                                                                                       \
        blk_t t;                                                                                \
        TAIL(p + i * (ES), n - i, &t);                                                          \
        double mx = _mm512_reduce_max_pd(_mm512_max_pd(mx0, mx1));                              \
        double mn = _mm512_reduce_min_pd(_mm512_min_pd(mn0, mn1));                              \
        r->max = t.max > mx ? t.max : mx;                                                       \
        r->min = t.min < mn ? t.min : mn;                                                       \
        r->sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1)) + t.sum;                           \
        r->asum = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1)) + t.asum;                         \
        r->sq = _mm512_reduce_add_pd(_mm512_add_pd(q0, q1)) + t.sq;                             \
        r->zero = (int64_t)_mm512_reduce_add_epi64(z0) + t.zero;                                \
    }

#define F64_LOADD512(i) _mm512_loadu_pd((const double *)p + (i))
#define I32_LOADD512(i) _mm512_cvtepi32_pd(_mm256_loadu_si256((const __m256i *)(p + 4 * (i))))
#define I64_LOADD512(i) _mm512_cvtepi64_pd(_mm512_loadu_si512((const void *)(p + 8 * (i))))
AVX512_DOUBLE_KERNEL(avx512_f64, F64_LOADD512, avx2_f64, 8)
AVX512_DOUBLE_KERNEL(avx512_i32, I32_LOADD512, avx2_i32, 4)
AVX512_DOUBLE_KERNEL(avx512_i64, I64_LOADD512, gen_i64, 8)

#endif /* FASTATS_X86 */

/* ------------------------------------------------------------------------------------------ */
/* dispatch                                                                                     */

enum { ISA_GENERIC = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };
static const char *const ISA_NAMES[] = {"generic", "avx2", "avx512"};

static blk_fn KERNELS[DT_COUNT];
static int active_isa = ISA_GENERIC;
static int best_isa = ISA_GENERIC;

static int detect_isa(void) {
#if FASTATS_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("avx"))
        return ISA_AVX2;
#endif
    return ISA_GENERIC;
}

#if FASTATS_X86
/* F16C is implied by every AVX2 CPU shipped, but check it rather than assume. */
static int has_f16c(void) {
    unsigned int a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    return (c & bit_F16C) != 0;
}
#endif

typedef void (*count_fn)(const char *p, size_t n, int dt, stats_t *s);
static count_fn COUNT_NONFINITE_FN = gen_count_nonfinite;

static void set_isa(int isa) {
    blk_fn gen[DT_COUNT] = {gen_f32, gen_f64, gen_f16, gen_bf16, gen_i8,
                            gen_u8,  gen_i16, gen_i32, gen_i64,  gen_bool};
    memcpy(KERNELS, gen, sizeof gen);
    COUNT_NONFINITE_FN = gen_count_nonfinite;
#if FASTATS_X86
    int f16c = has_f16c();
    if (isa >= ISA_AVX2) {
        KERNELS[DT_FLOAT32] = avx2_f32;
        KERNELS[DT_FLOAT64] = avx2_f64;
        KERNELS[DT_BFLOAT16] = avx2_bf16;
        if (f16c) KERNELS[DT_FLOAT16] = avx2_f16;
        KERNELS[DT_INT8] = avx2_i8;
        KERNELS[DT_UINT8] = avx2_u8;
        KERNELS[DT_INT16] = avx2_i16;
        KERNELS[DT_INT32] = avx2_i32;
        KERNELS[DT_BOOL] = avx2_bool;
        COUNT_NONFINITE_FN = avx2_count_nonfinite;
    }
    if (isa >= ISA_AVX512) {
        KERNELS[DT_FLOAT32] = avx512_f32;
        KERNELS[DT_FLOAT64] = avx512_f64;
        KERNELS[DT_BFLOAT16] = avx512_bf16;
        if (f16c) KERNELS[DT_FLOAT16] = avx512_f16;
        KERNELS[DT_INT32] = avx512_i32;
        KERNELS[DT_INT64] = avx512_i64;
    }
#endif
    active_isa = isa;
}

/* ------------------------------------------------------------------------------------------ */
/* driver                                                                                       */

/* reduce_all in parts: reduce_more() over consecutive pieces of one tensor, every piece but the last a
 * multiple of BLOCK elements, gives what one reduce_all() gives, bit for bit (the same blocks, summed in the
 * same order). */
static void reduce_init(stats_t *s) {
    stats_t init = {-INFINITY, INFINITY, 0.0, 0.0, 0.0, 0, 0, 0, 0};
    *s = init;
}

static void reduce_more(stats_t *s, const char *p, size_t n, int dt) {
    const size_t es = ELSIZE[dt];
    const blk_fn kern = KERNELS[dt];
    const int floating = dt <= DT_BFLOAT16;
    for (size_t off = 0; off < n; off += BLOCK) {
        size_t m = n - off < BLOCK ? n - off : BLOCK;
        const char *bp = p + off * es;
        blk_t b;
        kern(bp, m, &b);
        s->sum += b.sum;
        s->asum += b.asum;
        s->sq += b.sq;
        s->zero += b.zero;
        if (b.max > s->max) s->max = b.max;
        if (b.min < s->min) s->min = b.min;
        /* abs_sum is finite iff the block holds no NaN/Inf (float64 may also overflow: then the
         * counting pass simply finds nothing). */
        if (floating && !isfinite(b.asum)) COUNT_NONFINITE_FN(bp, m, dt, s);
    }
}

static void reduce_finish(stats_t *s, size_t numel, double *out) {
    if (numel == 0 || s->nan > 0) {
        s->max = NAN;
        s->min = NAN;
    }
    double res[9] = {s->max,         s->min,         s->sum,          s->asum,         s->sq,
                     (double)s->zero, (double)s->nan, (double)s->pinf, (double)s->ninf};
    memcpy(out, res, sizeof res);
}

static void reduce_all(const char *p, Py_ssize_t numel, int dt, double *out) {
    stats_t s;
    reduce_init(&s);
    reduce_more(&s, p, (size_t)numel, dt);
    reduce_finish(&s, (size_t)numel, out);
}

/* ------------------------------------------------------------------------------------------ */
/* Python bindings                                                                              */

/* Parse an address argument.  Returns 0 and sets *out on success, -1 with an exception set. */
static int arg_ptr(PyObject *o, const char *what, void **out) {
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "reduce(): %s must be an int address, not %.100s", what,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "reduce(): %s is not a valid address (negative or too large)", what);
        }
        return -1;
    }
    if (v > (unsigned long long)UINTPTR_MAX) {
        PyErr_Format(PyExc_ValueError, "reduce(): %s is not a valid address (too large)", what);
        return -1;
    }
    *out = (void *)(uintptr_t)v;
    return 0;
}

PyDoc_STRVAR(reduce_doc,
             "reduce(ptr, numel, dtype, out_ptr) -> None\n\n"
             "Read `numel` contiguous elements of type `dtype` (a module dtype code) at address `ptr`\n"
             "and write 9 float64 values at address `out_ptr`: [max, min, sum, abs_sum, sq_sum,\n"
             "zero_count, nan_count, pos_inf_count, neg_inf_count].  max/min are NaN if any NaN is\n"
             "present or numel == 0.  The caller guarantees both buffers are valid.");

static PyObject *fastats_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "reduce() takes exactly 4 arguments (ptr, numel, dtype, out_ptr), %zd given",
                     nargs);
        return NULL;
    }
    void *ptr = NULL, *out = NULL;
    if (arg_ptr(args[0], "ptr", &ptr) < 0) return NULL;
    if (!PyLong_Check(args[1]) || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "reduce(): numel and dtype must be ints");
        return NULL;
    }
    Py_ssize_t numel = PyLong_AsSsize_t(args[1]);
    if (numel == -1 && PyErr_Occurred()) return NULL;
    long dtype = PyLong_AsLong(args[2]);
    if (dtype == -1 && PyErr_Occurred()) return NULL;
    if (arg_ptr(args[3], "out_ptr", &out) < 0) return NULL;

    if (numel < 0) {
        PyErr_Format(PyExc_ValueError, "reduce(): numel must be >= 0, got %zd", numel);
        return NULL;
    }
    if (dtype < 0 || dtype >= DT_COUNT) {
        PyErr_Format(PyExc_ValueError,
                     "reduce(): unknown dtype code %ld (expected 0..%d: FLOAT32=0, FLOAT64=1, FLOAT16=2, "
                     "BFLOAT16=3, INT8=4, UINT8=5, INT16=6, INT32=7, INT64=8, BOOL=9)",
                     dtype, DT_COUNT - 1);
        return NULL;
    }
    if (out == NULL) {
        PyErr_SetString(PyExc_ValueError, "reduce(): out_ptr is a null pointer");
        return NULL;
    }
    if (ptr == NULL && numel > 0) {
        PyErr_SetString(PyExc_ValueError, "reduce(): ptr is a null pointer but numel > 0");
        return NULL;
    }
    if ((size_t)numel > (size_t)PY_SSIZE_T_MAX / ELSIZE[dtype]) {
        PyErr_SetString(PyExc_ValueError, "reduce(): numel too large for dtype");
        return NULL;
    }

    if (numel > GIL_RELEASE_NUMEL) {
        Py_BEGIN_ALLOW_THREADS
        reduce_all((const char *)ptr, numel, (int)dtype, (double *)out);
        Py_END_ALLOW_THREADS
    } else {
        reduce_all((const char *)ptr, numel, (int)dtype, (double *)out);
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------------ */
/* update_norms: an optimizer step's |w_new - w_old|^2 and |w_new|^2 in one pass, the buffer that  */
/* held w_old left holding w_new (the next step's "before").  The difference is taken in the       */
/* element type, as `buf.sub_(w)` would; squares are summed in double.                              */

typedef void (*upd_fn)(char *b, const char *p, size_t n, double *dd, double *ww);

static void gen_upd_f32(char *b, const char *p, size_t n, double *dd, double *ww) {
    float *bf = (float *)b;
    const float *pf = (const float *)p;
    double d0 = 0, d1 = 0, d2 = 0, d3 = 0, w0 = 0, w1 = 0, w2 = 0, w3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float x0 = pf[i], x1 = pf[i + 1], x2 = pf[i + 2], x3 = pf[i + 3];
        double e0 = (double)(x0 - bf[i]), e1 = (double)(x1 - bf[i + 1]);
        double e2 = (double)(x2 - bf[i + 2]), e3 = (double)(x3 - bf[i + 3]);
        bf[i] = x0, bf[i + 1] = x1, bf[i + 2] = x2, bf[i + 3] = x3;
        d0 += e0 * e0, d1 += e1 * e1, d2 += e2 * e2, d3 += e3 * e3;
        w0 += (double)x0 * x0, w1 += (double)x1 * x1, w2 += (double)x2 * x2, w3 += (double)x3 * x3;
    }
    for (; i < n; i++) {
        float x = pf[i];
        double e = (double)(x - bf[i]);
        bf[i] = x;
        d0 += e * e;
        w0 += (double)x * x;
    }
    *dd = (d0 + d1) + (d2 + d3);
    *ww = (w0 + w1) + (w2 + w3);
}

static void gen_upd_f64(char *b, const char *p, size_t n, double *dd, double *ww) {
    double *bd = (double *)b;
    const double *pd = (const double *)p;
    double d0 = 0, d1 = 0, w0 = 0, w1 = 0;
    size_t i = 0;
    for (; i + 2 <= n; i += 2) {
        double x0 = pd[i], x1 = pd[i + 1], e0 = x0 - bd[i], e1 = x1 - bd[i + 1];
        bd[i] = x0, bd[i + 1] = x1;
        d0 += e0 * e0, d1 += e1 * e1, w0 += x0 * x0, w1 += x1 * x1;
    }
    for (; i < n; i++) {
        double x = pd[i], e = x - bd[i];
        bd[i] = x;
        d0 += e * e, w0 += x * x;
    }
    *dd = d0 + d1;
    *ww = w0 + w1;
}

#if FASTATS_X86
static FASTATS_AVX2 void avx2_upd_f32(char *b, const char *p, size_t n, double *dd, double *ww) {
    float *bf = (float *)b;
    const float *pf = (const float *)p;
    __m256d d0 = _mm256_setzero_pd(), d1 = d0, w0 = d0, w1 = d0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(pf + i), e = _mm256_sub_ps(x, _mm256_loadu_ps(bf + i));
        _mm256_storeu_ps(bf + i, x);
        __m256d xl = _mm256_cvtps_pd(_mm256_castps256_ps128(x)), xh = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
        __m256d el = _mm256_cvtps_pd(_mm256_castps256_ps128(e)), eh = _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1));
        d0 = _mm256_fmadd_pd(el, el, d0);
        d1 = _mm256_fmadd_pd(eh, eh, d1);
        w0 = _mm256_fmadd_pd(xl, xl, w0);
        w1 = _mm256_fmadd_pd(xh, xh, w1);
    }
    double a[4], c[4], td = 0, tw = 0;
    _mm256_storeu_pd(a, _mm256_add_pd(d0, d1));
    _mm256_storeu_pd(c, _mm256_add_pd(w0, w1));
    gen_upd_f32(b + i * 4, p + i * 4, n - i, &td, &tw);
    *dd = ((a[0] + a[1]) + (a[2] + a[3])) + td;
    *ww = ((c[0] + c[1]) + (c[2] + c[3])) + tw;
}
#endif

PyDoc_STRVAR(update_norms_doc,
             "update_norms(buf_ptr, ptr, numel, dtype) -> (diff_sq_sum, sq_sum)\n\n"
             "For `numel` contiguous FLOAT32 or FLOAT64 elements at `ptr` (the weights after a step) and\n"
             "at `buf_ptr` (the weights before it): the sum of squares of (after - before), the difference\n"
             "taken in the element type, and the sum of squares of `after`; the buffer is left holding\n"
             "`after`.  The caller guarantees both buffers are valid and do not overlap.");

static PyObject *fastats_update_norms(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "update_norms() takes exactly 4 arguments (buf_ptr, ptr, numel, dtype), "
                     "%zd given", nargs);
        return NULL;
    }
    void *buf = NULL, *ptr = NULL;
    if (arg_ptr(args[0], "buf_ptr", &buf) < 0 || arg_ptr(args[1], "ptr", &ptr) < 0) return NULL;
    Py_ssize_t numel = PyLong_AsSsize_t(args[2]);
    if (numel == -1 && PyErr_Occurred()) return NULL;
    long dtype = PyLong_AsLong(args[3]);
    if (dtype == -1 && PyErr_Occurred()) return NULL;
    if (numel < 0 || (numel > 0 && (buf == NULL || ptr == NULL))) {
        PyErr_SetString(PyExc_ValueError, "update_norms(): numel must be >= 0 and the pointers valid");
        return NULL;
    }
    upd_fn fn;
    if (dtype == DT_FLOAT32) {
        fn = gen_upd_f32;
#if FASTATS_X86
        if (active_isa >= ISA_AVX2) fn = avx2_upd_f32;
#endif
    } else if (dtype == DT_FLOAT64) {
        fn = gen_upd_f64;
    } else {
        PyErr_Format(PyExc_ValueError, "update_norms(): dtype %ld is not FLOAT32 or FLOAT64", dtype);
        return NULL;
    }
    double dd = 0.0, ww = 0.0;
    if (numel > GIL_RELEASE_NUMEL) {
        Py_BEGIN_ALLOW_THREADS
        fn((char *)buf, (const char *)ptr, (size_t)numel, &dd, &ww);
        Py_END_ALLOW_THREADS
    } else {
        fn((char *)buf, (const char *)ptr, (size_t)numel, &dd, &ww);
    }
    return Py_BuildValue("(dd)", dd, ww);
}

/* ------------------------------------------------------------------------------------------ */
/* read_npy_stats: a kernel dump's .npy files read and reduced in one call                     */

/* The dtypes read natively, by .npy descr (little-endian hosts only): code and numpy's name. */
static const struct {
    const char *descr;
    int code;
    const char *name;
} NPY_DESCRS[] = {
    {"<f4", DT_FLOAT32, "float32"}, {"<f8", DT_FLOAT64, "float64"}, {"<f2", DT_FLOAT16, "float16"},
    {"|V2", DT_BFLOAT16, "bfloat16"}, {"|i1", DT_INT8, "int8"},       {"|u1", DT_UINT8, "uint8"},
    {"<i2", DT_INT16, "int16"},       {"<i4", DT_INT32, "int32"},     {"<i8", DT_INT64, "int64"},
    {"|b1", DT_BOOL, "bool"},
};
#define NPY_NDESCRS ((int)(sizeof NPY_DESCRS / sizeof NPY_DESCRS[0]))
#define NPY_MAXDIMS 32

typedef struct {
    int desc; /* index into NPY_DESCRS; -1: left to Python */
    int ndim;
    long long dims[NPY_MAXDIMS];
    long long count;
} npy_info_t;

FASTATS_INLINE int npy_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static const char *npy_skip(const char *p, const char *end) {
    while (p < end && npy_space(*p)) p++;
    return p;
}

static const char *npy_lit(const char *p, const char *end, const char *lit) {
    size_t n = strlen(lit);
    return (size_t)(end - p) >= n && memcmp(p, lit, n) == 0 ? p + n : NULL;
}

/* Parse a header dict exactly as npy_read._HEADER does ("{'descr': '<f4', 'fortran_order': False,
 * 'shape': (2, 3), }"); 0 on success (C order and a native dtype only), -1: left to Python. */
static int npy_parse_header(const char *p, const char *end, npy_info_t *info) {
    p = npy_skip(p, end);
    if (!(p = npy_lit(p, end, "{"))) return -1;
    p = npy_skip(p, end);
    if (!(p = npy_lit(p, end, "'descr':"))) return -1;
    p = npy_skip(p, end);
    if (!(p = npy_lit(p, end, "'"))) return -1;
    const char *d0 = p;
    while (p < end && *p != '\'') p++;
    if (p == end || p == d0) return -1;
    size_t dlen = (size_t)(p - d0);
    p++;
    if (!(p = npy_lit(p, end, ","))) return -1;
    p = npy_skip(p, end);
    if (!(p = npy_lit(p, end, "'fortran_order':"))) return -1;
    p = npy_skip(p, end);
    if (!(p = npy_lit(p, end, "False"))) return -1; /* Fortran order (and anything else): numpy's path */
    if (!(p = npy_lit(p, end, ","))) return -1;
    p = npy_skip(p, end);
    if (!(p = npy_lit(p, end, "'shape':"))) return -1;
    p = npy_skip(p, end);
    if (!(p = npy_lit(p, end, "("))) return -1;
    info->ndim = 0;
    info->count = 1;
    for (;;) {
        p = npy_skip(p, end);
        if (p < end && *p == ')') break;
        if (p == end || *p < '0' || *p > '9') return -1;
        long long v = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            if (v > (LLONG_MAX - 9) / 10) return -1;
            v = v * 10 + (*p++ - '0');
        }
        if (info->ndim == NPY_MAXDIMS) return -1;
        info->dims[info->ndim++] = v;
        if (v != 0 && info->count > LLONG_MAX / v) return -1;
        info->count *= v;
        p = npy_skip(p, end);
        if (p < end && *p == ',') p++;
        else if (p < end && *p == ')') break;
        else return -1;
    }
    p++; /* ')' */
    if (p < end && *p == ',') p++;
    p = npy_skip(p, end);
    if (!(p = npy_lit(p, end, "}"))) return -1;
    if (npy_skip(p, end) != end) return -1;
    info->desc = -1;
    for (int k = 0; k < NPY_NDESCRS; k++)
        if (strlen(NPY_DESCRS[k].descr) == dlen && memcmp(NPY_DESCRS[k].descr, d0, dlen) == 0) info->desc = k;
    return info->desc < 0 ? -1 : 0;
}

/* A file is read in pieces of at most NPY_BUF bytes into one buffer that stays in cache for the reduction:
 * the first piece holds the header (at most NPY_HEAD bytes are parsed here) and, for most dump files, all
 * the data; a larger file's data follows in pieces of whole BLOCKs (so the statistics are reduce_all's). */
#define NPY_HEAD 4096
#define NPY_BUF (NPY_HEAD + 8 * BLOCK * 8)

/* Read up to n bytes at `offset` (fewer only at the end of the file); the count, or -1. */
static Py_ssize_t npy_pread(int fd, char *buf, size_t n, size_t offset) {
    size_t got = 0;
    while (got < n) {
#ifdef _WIN32
        if (_lseeki64(fd, (long long)(offset + got), SEEK_SET) < 0) return -1;
        int r = _read(fd, buf + got, (unsigned)(n - got));
#else
        ssize_t r = pread(fd, buf + got, n - got, (off_t)(offset + got));
#endif
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (Py_ssize_t)got;
}

/* One open file: 0 and its statistics in out[0..8], or -1 (left to Python). */
static int npy_stats_fd(int fd, char *buf, npy_info_t *info, double *out) {
    Py_ssize_t first = npy_pread(fd, buf, NPY_BUF, 0);
    if (first < 10) return -1;
    size_t size = (size_t)first;
    const unsigned char *b = (const unsigned char *)buf;
    if (memcmp(b, "\x93NUMPY", 6) != 0) return -1;
    size_t start, hlen;
    if (b[6] == 1) {
        start = 10;
        hlen = (size_t)b[8] | (size_t)b[9] << 8;
    } else if (b[6] == 2 || b[6] == 3) {
        if (size < 12) return -1;
        start = 12;
        hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
    } else {
        return -1;
    }
    if (start + hlen > NPY_HEAD || size < start + hlen) return -1; /* a long header: numpy's path */
    if (npy_parse_header(buf + start, buf + start + hlen, info) < 0) return -1;
    const int dt = NPY_DESCRS[info->desc].code;
    const size_t es = ELSIZE[dt];
    const size_t off = start + hlen;
    const size_t count = (size_t)info->count;
    if ((unsigned long long)info->count > (unsigned long long)(PY_SSIZE_T_MAX / es)) return -1;
    stats_t st;
    reduce_init(&st);
    size_t have = (size - off) / es; /* whole elements in the first piece */
    size_t done = 0;
    if (have >= count) {
        reduce_more(&st, buf + off, count, dt);
        done = count;
    } else {
        size_t head = have / BLOCK * BLOCK;
        reduce_more(&st, buf + off, head, dt);
        done = head;
        const size_t piece = (NPY_BUF / es) / BLOCK * BLOCK; /* elements per later read */
        while (done < count) {
            size_t m = count - done < piece ? count - done : piece;
            Py_ssize_t got = npy_pread(fd, buf, m * es, off + done * es);
            if (got < 0 || (size_t)got != m * es) return -1; /* truncated (or changed while read) */
            reduce_more(&st, buf, m, dt);
            done += m;
        }
    }
    reduce_finish(&st, count, out);
    return 0;
}

/* One file: 0 and its statistics in out[0..8], or -1 (left to Python). `dirfd`: an open directory the name
 * after the path's last '/' is looked up in (the files of one dump folder go through one path walk), or -1. */
static int npy_stats_one(const char *path, int dirfd, char *buf, npy_info_t *info, double *out) {
#ifdef _WIN32
    (void)dirfd;
    int fd = _open(path, _O_RDONLY | _O_BINARY);
#else
    const char *slash = strrchr(path, '/');
    int fd = dirfd >= 0 && slash != NULL ? openat(dirfd, slash + 1, O_RDONLY) : open(path, O_RDONLY);
#endif
    if (fd < 0) return -1;
    int rc = npy_stats_fd(fd, buf, info, out);
#ifdef _WIN32
    _close(fd);
#else
    close(fd);
#endif
    return rc;
}

/* The files of `paths` (n) into out and info/ok, a directory opened once for consecutive files in it. */
static void npy_stats_all(PyObject **encoded, Py_ssize_t n, npy_info_t *infos, int *ok, double *out) {
    char *buf = (char *)malloc(NPY_BUF);
    if (buf == NULL) return; /* every ok[i] stays 0: Python reads them */
    int dirfd = -1;
    const char *dir = NULL;
    size_t dirlen = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *path = PyBytes_AS_STRING(encoded[i]);
#ifndef _WIN32
        const char *slash = strrchr(path, '/');
        size_t len = slash != NULL ? (size_t)(slash - path) : 0;
        if (slash != NULL && len > 0 && (dir == NULL || len != dirlen || memcmp(dir, path, len) != 0)) {
            if (dirfd >= 0) close(dirfd);
            char *d = (char *)malloc(len + 1);
            dirfd = -1;
            if (d != NULL) {
                memcpy(d, path, len);
                d[len] = 0;
                dirfd = open(d, O_RDONLY | O_DIRECTORY);
                free(d);
            }
            dir = path;
            dirlen = len;
        }
        int use = slash != NULL && len > 0 ? dirfd : -1;
#else
        int use = -1;
#endif
        ok[i] = npy_stats_one(path, use, buf, &infos[i], out + 9 * i) == 0;
    }
#ifndef _WIN32
    if (dirfd >= 0) close(dirfd);
#endif
    free(buf);
}

PyDoc_STRVAR(read_npy_stats_doc,
             "read_npy_stats(paths, out) -> list\n\n"
             "Read each .npy file of `paths` (a list of str) and write its 9 statistics (as reduce())\n"
             "into row i of `out` (a writable C-contiguous float64 buffer of at least len(paths) * 9 values).\n"
             "Item i of the result is (dtype name, shape, size, nbytes) for a file read here, or None for one left\n"
             "to the caller: not readable, truncated, changed while read, or a header or dtype read natively\n"
             "by numpy only (Fortran order, big-endian, structured, complex, ...). Releases the GIL.");

static PyObject *fastats_read_npy_stats(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *paths, *outobj;
    if (!PyArg_ParseTuple(args, "O!O:read_npy_stats", &PyList_Type, &paths, &outobj)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(paths);
    Py_buffer view;
    if (PyObject_GetBuffer(outobj, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    PyObject *result = NULL;
    PyObject **encoded = NULL;
    npy_info_t *infos = NULL;
    int *ok = NULL;
    const uint16_t probe = 1;
    const int little = *(const unsigned char *)&probe == 1;
    if ((size_t)view.len < (size_t)n * 9 * sizeof(double)) {
        PyErr_Format(PyExc_ValueError, "read_npy_stats(): out holds %zd bytes, %zd files need %zd", view.len, n,
                     n * 9 * (Py_ssize_t)sizeof(double));
        goto done;
    }
    encoded = (PyObject **)PyMem_Calloc((size_t)n + 1, sizeof(PyObject *));
    infos = (npy_info_t *)PyMem_Malloc(((size_t)n + 1) * sizeof(npy_info_t));
    ok = (int *)PyMem_Calloc((size_t)n + 1, sizeof(int));
    if (encoded == NULL || infos == NULL || ok == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyUnicode_FSConverter(PyList_GET_ITEM(paths, i), &encoded[i])) goto done;
    }
    if (little) {
        double *out = (double *)view.buf;
        Py_BEGIN_ALLOW_THREADS
        npy_stats_all(encoded, n, infos, ok, out);
        Py_END_ALLOW_THREADS
    }
    result = PyList_New(n);
    if (result == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item;
        if (!ok[i]) {
            item = Py_None;
            Py_INCREF(item);
        } else {
            const npy_info_t *info = &infos[i];
            PyObject *shape = PyTuple_New(info->ndim);
            if (shape == NULL) goto fail;
            for (int d = 0; d < info->ndim; d++) {
                PyObject *v = PyLong_FromLongLong(info->dims[d]);
                if (v == NULL) {
                    Py_DECREF(shape);
                    goto fail;
                }
                PyTuple_SET_ITEM(shape, d, v);
            }
            item = Py_BuildValue("(sNLL)", NPY_DESCRS[info->desc].name, shape, info->count,
                                 info->count * (long long)ELSIZE[NPY_DESCRS[info->desc].code]);
            if (item == NULL) goto fail;
        }
        PyList_SET_ITEM(result, i, item);
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    if (encoded != NULL)
        for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(encoded[i]);
    PyMem_Free(encoded);
    PyMem_Free(infos);
    PyMem_Free(ok);
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(isa_doc,
             "_set_isa(name=None) -> str\n\n"
             "Testing/benchmark hook: select the SIMD kernel set ('generic', 'avx2', 'avx512', or None\n"
             "for the best supported one) and return the active name.  Raises ValueError if the CPU\n"
             "(or this build) does not support it.  Not thread-safe with concurrent reduce() calls.");

static PyObject *fastats_set_isa(PyObject *self, PyObject *args) {
    (void)self;
    const char *name = NULL;
    if (!PyArg_ParseTuple(args, "|z:_set_isa", &name)) return NULL;
    if (name == NULL) {
        set_isa(best_isa);
    } else {
        int want = -1;
        for (int k = 0; k < 3; k++)
            if (strcmp(name, ISA_NAMES[k]) == 0) want = k;
        if (want < 0) {
            PyErr_Format(PyExc_ValueError, "_set_isa(): unknown ISA %R (expected 'generic', 'avx2' or 'avx512')",
                         PyTuple_GET_ITEM(args, 0));
            return NULL;
        }
        if (want > best_isa) {
            PyErr_Format(PyExc_ValueError, "_set_isa(): ISA '%s' not supported here (best: '%s')", name,
                         ISA_NAMES[best_isa]);
            return NULL;
        }
        set_isa(want);
    }
    return PyUnicode_FromString(ISA_NAMES[active_isa]);
}

#include "_recorder.c" /* the capture's per-tensor hot path: slot() */

static PyMethodDef fastats_methods[] = {
    {"reduce", (PyCFunction)(void (*)(void))fastats_reduce, METH_FASTCALL, reduce_doc},
    {"read_npy_stats", fastats_read_npy_stats, METH_VARARGS, read_npy_stats_doc},
    {"update_norms", (PyCFunction)(void (*)(void))fastats_update_norms, METH_FASTCALL, update_norms_doc},
    {"_set_isa", fastats_set_isa, METH_VARARGS, isa_doc},
    {"measure", (PyCFunction)(void (*)(void))fastats_measure, METH_FASTCALL, measure_doc},
    {"measure_setup", fastats_measure_setup, METH_VARARGS, measure_setup_doc},
    {"version", fastats_version, METH_O, version_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fastats_module = {
    PyModuleDef_HEAD_INIT, "nbdebug.frameworks._fastats",
    "Single-pass tensor statistics kernel (max, min, sum, abs_sum, sq_sum, zero/nan/+inf/-inf counts).", -1,
    fastats_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastats(void) {
    PyObject *m = PyModule_Create(&fastats_module);
    if (m == NULL) return NULL;
    static const char *const names[DT_COUNT] = {"FLOAT32", "FLOAT64", "FLOAT16", "BFLOAT16", "INT8",
                                                "UINT8",   "INT16",   "INT32",   "INT64",    "BOOL"};
    for (int k = 0; k < DT_COUNT; k++) {
        if (PyModule_AddIntConstant(m, names[k], k) < 0) goto fail;
    }
    if (PyModule_AddIntConstant(m, "NUM_STATS", 9) < 0) goto fail;
    best_isa = detect_isa();
    set_isa(best_isa);
    if (PyModule_AddStringConstant(m, "BEST_ISA", ISA_NAMES[best_isa]) < 0) goto fail;
    if (rec_init(m) < 0) goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
