/*
 * Montgomery multiplication on AVX-512 IFMA: the optional fast kernel behind
 * `penrose-core/src/paillier/montgomery.rs` (Rust module `montgomery::ifma`).
 *
 * penrose_mont_mul_ifma(acc, x, modulus, k0, digits) computes
 *
 *     acc = acc * x * R^-1 mod N,   R = 2^(52 * digits) = 2^(64 * limbs),
 *
 * fully reduced (acc < N afterwards), for acc < N and x < R, on little-endian 64-bit limbs.
 * That is exactly what the GMP path (`Montgomery::mul_assign`) computes with the same R, so the
 * two give identical limbs.
 *
 * Layout: numbers are held as `digits` digits of 52 bits, one per 64-bit lane, 8 per zmm
 * register. `digits` must be a multiple of 16 (so that 52 * digits is a whole number of 64-bit
 * limbs, limbs = 13 * digits / 16) and at most PENROSE_IFMA_MAX_DIGITS. The caller passes the
 * modulus already split into digits (each < 2^52) and k0 = -N^-1 mod 2^52.
 *
 * Algorithm: word-by-word almost-Montgomery multiplication (AMM). With a, b, N in digits and
 * an accumulator `res` of one 64-bit lane per digit, for each digit b[i] of b:
 *
 *     res += lo52(a * b[i])                 (vpmadd52luq, lane j gets lo52(a[j] b[i]))
 *     y    = (res[0] * k0) mod 2^52         (so that res[0] + lo52(N[0] y) = 0 mod 2^52)
 *     res += lo52(N * y)
 *     carry res[0] >> 52 into res[1]; shift every lane down one digit (valignq); the lane
 *          shifted out is 0 mod 2^52, so the value is divided by 2^52 exactly
 *     res += hi52(a * b[i]) + hi52(N * y)   (vpmadd52huq: the high halves belong one digit
 *          up, which after the shift is the same lane index as their low halves' source)
 *
 * As an integer, each iteration maps V to (V + a b[i] + N y) / 2^52; after all `digits`
 * iterations V = (a b + N Y) / R for some Y < R, so V = a b R^-1 mod N and
 * V < a b / R + N < N + N = 2N (a < N, b < R). One conditional subtraction of N reduces it.
 *
 * Lazy carries (why no lane overflows): lanes are not normalised inside the loop. A lane's
 * content enters at the top lane as 0, moves down one lane per iteration and is shifted out
 * of lane 0 `digits` iterations later. Per iteration it receives at most 4 terms, each at
 * most 2^52 - 1 (lo52 or hi52 of a product of two numbers below 2^52): 2 high halves when it
 * enters, 2 low and 2 high halves in each of the next digits - 1 iterations, 2 low halves in
 * the last, 4 * digits terms in all. With digits = 80 that is below 320 * 2^52 < 2^61, far
 * below 2^64. The carries out of lane 0 never enter the vector (next paragraph); the scalar
 * that holds lane 0 is a lane plus at most 2^53 + 2^10. In general a lane stays below
 * 4 * digits * 2^52 + 2^54, which is below 2^64 for digits < 1024; PENROSE_IFMA_MAX_DIGITS
 * (256, lanes below 2^63) is well inside it.
 *
 * The low lane: y and the carry depend only on lane 0, so lane 0 lives in a scalar register
 * and y is computed there (lo52 of a product of two 52-bit numbers is the 64-bit product mod
 * 2^52); the scalar also takes the carry and the high halves owed to the next lane 0, which
 * it reads from lane 1 of the vector before the shift (see amm_lanes). So y never waits for
 * the high-half multiplications or the shift.
 *
 * After the loop, reduce() normalises the lanes to 52-bit digits and subtracts N once if
 * needed, both with carry lookahead on one bit per digit instead of a digit-by-digit chain.
 *
 * Only the functions marked IFMA use AVX-512 instructions (target attribute, not a global
 * -m flag): the rest of the crate runs on any x86-64, and the Rust side calls in only after
 * detecting avx512f and avx512ifma at run time. No allocation: everything is on the stack
 * (about 12 KiB at the maximum size).
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define IFMA __attribute__((target("avx512f,avx512ifma")))
#define ALWAYS_INLINE inline __attribute__((always_inline))

#define DIGIT_BITS 52
#define DIGIT_MASK ((UINT64_C(1) << DIGIT_BITS) - 1)
#define LANES 8
/* Matches MAX_DIGITS in montgomery/ifma.rs. */
#define PENROSE_IFMA_MAX_DIGITS 256
#define MAX_VECTORS (PENROSE_IFMA_MAX_DIGITS / LANES)

int penrose_mont_mul_ifma(uint64_t *acc, const uint64_t *x, const uint64_t *modulus,
                          uint64_t k0, size_t digits);

/* 16 digits of 52 bits are 13 limbs of 64 bits (832 bits): the conversions work block by
 * block, with the block's loop unrolled so that every shift is a constant. */
#define BLOCK_DIGITS 16
#define BLOCK_LIMBS 13

/* `digits` digits of 52 bits (bits 52 j .. 52 j + 51) from the first 13 * digits / 16 limbs. */
static ALWAYS_INLINE void limbs_to_digits(const uint64_t *limbs, size_t digits, uint64_t *out)
{
    for (size_t h = 0; h < digits / BLOCK_DIGITS; h++) {
        const uint64_t *l = limbs + BLOCK_LIMBS * h;
        uint64_t *d = out + BLOCK_DIGITS * h;
#pragma GCC unroll 16
        for (unsigned t = 0; t < BLOCK_DIGITS; t++) {
            const unsigned bit = DIGIT_BITS * t;
            const unsigned q = bit / 64;
            const unsigned s = bit % 64;
            uint64_t v = l[q] >> s;
            /* A digit that crosses into the next limb (that limb is inside the block: the
             * block's last digit starts at bit 780 = 64 * 12 + 12 and ends at its end). */
            if (s > 64 - DIGIT_BITS) {
                v |= l[q + 1] << (64 - s);
            }
            d[t] = v & DIGIT_MASK;
        }
    }
}

/* The inverse: `digits` digits, each below 2^52, into 13 * digits / 16 limbs. */
static ALWAYS_INLINE void digits_to_limbs(const uint64_t *digit, size_t digits, uint64_t *limbs)
{
    for (size_t h = 0; h < digits / BLOCK_DIGITS; h++) {
        const uint64_t *d = digit + BLOCK_DIGITS * h;
        uint64_t *l = limbs + BLOCK_LIMBS * h;
#pragma GCC unroll 13
        for (unsigned q = 0; q < BLOCK_LIMBS; q++) {
            /* Limb q holds bits 64 q .. 64 q + 63 of the block: the top of digit t, all of
             * digit t + 1 and, when those two give fewer than 64 bits, the bottom of t + 2.
             * Bits shifted past bit 63 belong to the next limb and are dropped here. */
            const unsigned bit = 64 * q;
            const unsigned t = bit / DIGIT_BITS;
            const unsigned s = bit % DIGIT_BITS;
            uint64_t v = (d[t] >> s) | (d[t + 1] << (DIGIT_BITS - s));
            if (2 * DIGIT_BITS - s < 64) {
                v |= d[t + 2] << (2 * DIGIT_BITS - s);
            }
            l[q] = v;
        }
    }
}

__extension__ typedef unsigned __int128 u128;

/* Vector k (digits 8 k .. 8 k + 7) of a digit array. */
static ALWAYS_INLINE IFMA __m512i load(const uint64_t *digit, size_t k)
{
    return _mm512_loadu_si512((const void *)(digit + LANES * k));
}

/*
 * The AMM loop: lanes[0 .. 8 nv) = a * b * 2^(-52 * 8 nv) (mod N), as unnormalised lanes whose
 * value is below 2N (see the header). a, b, n: 8 nv digits each, below 2^52. Inlined into one
 * function per common size with nv a constant, so that the per-vector loops unroll and the
 * vectors stay in registers; the generic instance keeps them on the stack.
 */
static ALWAYS_INLINE IFMA void amm_lanes(uint64_t *lanes, const uint64_t *a, const uint64_t *b,
                                         const uint64_t *n, uint64_t k0, size_t nv)
{
    /* a and n are read as memory operands of vpmadd52 (the compiler keeps them in registers
     * where it can): only the accumulator has to be an array. */
    __m512i res[MAX_VECTORS];
    if (nv < 2 || nv > MAX_VECTORS) {
        return; /* never: the entry point checks the size */
    }

#pragma GCC unroll 32
    for (size_t k = 0; k < nv; k++) {
        res[k] = _mm512_setzero_si512();
    }

    const uint64_t a0 = a[0];
    const uint64_t n0 = n[0];
    /*
     * Lane 0 is kept in this scalar, exactly; the vector's lane 0 goes stale (it lacks the
     * carries) and is never read. Each iteration the scalar takes the whole products
     * a[0] b[i] and N[0] y rather than their 52-bit halves: the low halves make it 0 mod
     * 2^52, and what is left above bit 52 is the carry plus both high halves, which is what
     * the next lane 0 (the current lane 1, read from the vector before the shift) is owed.
     * So y never waits for the high-half multiplications or the shift.
     */
    uint64_t acc0 = 0;
    const size_t digits = LANES * nv;
    for (size_t i = 0; i < digits; i++) {
        const uint64_t bi = b[i];
        const __m512i vb = _mm512_set1_epi64((long long)bi);
        /* Below 2^62 + 2^104 + 2^104: fits. */
        u128 t = (u128)a0 * bi + acc0;
        const uint64_t y = ((uint64_t)t * k0) & DIGIT_MASK;
        const __m512i vy = _mm512_set1_epi64((long long)y);
        t += (u128)n0 * y; /* now 0 mod 2^52 */

#pragma GCC unroll 32
        for (size_t k = 0; k < nv; k++) {
            res[k] = _mm512_madd52lo_epu64(res[k], load(a, k), vb);
            res[k] = _mm512_madd52lo_epu64(res[k], load(n, k), vy);
        }
        /* Lane 1, complete but for this iteration's high halves, becomes lane 0. */
        acc0 = (uint64_t)_mm_extract_epi64(_mm512_castsi512_si128(res[0]), 1) +
               (uint64_t)(t >> DIGIT_BITS);

        /* Down one digit: lane j of vector k takes lane j + 1, lane 7 takes lane 0 of vector
         * k + 1 (still unshifted, as k rises), the top lane takes 0 (the mask clears it). */
#pragma GCC unroll 32
        for (size_t k = 0; k + 1 < nv; k++) {
            res[k] = _mm512_alignr_epi64(res[k + 1], res[k], 1);
        }
        res[nv - 1] = _mm512_maskz_alignr_epi64(0x7f, res[nv - 1], res[nv - 1], 1);
        /* The high halves belong one digit up: after the shift, the lane of their source. */
#pragma GCC unroll 32
        for (size_t k = 0; k < nv; k++) {
            res[k] = _mm512_madd52hi_epu64(res[k], load(a, k), vb);
            res[k] = _mm512_madd52hi_epu64(res[k], load(n, k), vy);
        }
    }

#pragma GCC unroll 32
    for (size_t k = 0; k < nv; k++) {
        _mm512_storeu_si512((void *)(lanes + LANES * k), res[k]);
    }
    lanes[0] = acc0;
}

/* One bit per digit, digit j at bit j % 64 of word j / 64, with a spare word for the carry
 * out of the top digit. */
#define MASK_WORDS (PENROSE_IFMA_MAX_DIGITS / 64 + 1)

/*
 * Carry (or borrow) lookahead over all digits at once. Digit j generates a carry when bit j
 * of g is set and passes an incoming one on when bit j of p is set (never both). Then the
 * carries into the digits are ((g << 1) + p) ^ p: the addition runs each generated carry up
 * through the propagating digits above it, and the xor leaves exactly the digits it reached.
 * Bit `digits` of the result is the carry out of the top digit. words = digits / 64 + 1.
 */
static ALWAYS_INLINE void lookahead(const uint64_t *g, const uint64_t *p, uint64_t *c,
                                    size_t words)
{
    uint64_t g_out = 0;
    uint64_t carry = 0;
    for (size_t w = 0; w < words; w++) {
        const uint64_t g_shifted = (g[w] << 1) | g_out;
        g_out = g[w] >> 63;
        const u128 sum = (u128)g_shifted + p[w] + carry;
        carry = (uint64_t)(sum >> 64);
        c[w] = (uint64_t)sum ^ p[w];
    }
}

/* The 8 bits of vector k in a bit-per-digit array, and back. */
static ALWAYS_INLINE void put_bits(uint64_t *bits, size_t k, __mmask8 m)
{
    bits[k / 8] |= (uint64_t)m << (8 * (k % 8));
}

static ALWAYS_INLINE __mmask8 get_bits(const uint64_t *bits, size_t k)
{
    return (__mmask8)(bits[k / 8] >> (8 * (k % 8)));
}

/*
 * The AMM lanes (value V < 2N, each lane below 2^63) to V mod N as 52-bit digits, in `out`.
 *
 * Normalising: one step of "keep the low 52 bits, add the lane below's high bits" leaves
 * every lane below 2^52 + 2^11, so each lane now carries out at most 1: surely when it is at
 * least 2^52 (generate), exactly when it gets a carry in if it is 2^52 - 1 (propagate). The
 * carries follow from lookahead(). V < R, so nothing leaves the top digit (the top lane's
 * high bits, dropped by the first step, are 0: V >= (top lane) 2^(52 (digits - 1))).
 *
 * Reducing: V - N digit by digit, where digit j borrows when V's is below N's (generate) or,
 * given a borrow in, when they are equal (propagate); the borrow out of the top digit says
 * V < N, and then V itself is the result.
 */
static ALWAYS_INLINE IFMA void reduce(const uint64_t *lanes, const uint64_t *modulus, size_t nv,
                                      uint64_t *out)
{
    const __m512i mask = _mm512_set1_epi64((long long)DIGIT_MASK);
    const __m512i one = _mm512_set1_epi64(1);
    const size_t words = nv * LANES / 64 + 1;
    __m512i v[MAX_VECTORS];
    uint64_t g[MASK_WORDS] = {0};
    uint64_t p[MASK_WORDS] = {0};
    uint64_t c[MASK_WORDS];

    __m512i below = _mm512_setzero_si512();
#pragma GCC unroll 32
    for (size_t k = 0; k < nv; k++) {
        const __m512i lane = load(lanes, k);
        const __m512i high = _mm512_srli_epi64(lane, DIGIT_BITS);
        /* [lane 7 of the vector below's high bits, this vector's lanes 0..6] */
        v[k] = _mm512_add_epi64(_mm512_and_si512(lane, mask),
                                _mm512_alignr_epi64(high, below, 7));
        below = high;
        put_bits(g, k, _mm512_cmpgt_epu64_mask(v[k], mask));
        put_bits(p, k, _mm512_cmpeq_epu64_mask(v[k], mask));
    }
    lookahead(g, p, c, words);
    for (size_t w = 0; w < words; w++) {
        g[w] = 0;
        p[w] = 0;
    }
#pragma GCC unroll 32
    for (size_t k = 0; k < nv; k++) {
        v[k] = _mm512_and_si512(_mm512_mask_add_epi64(v[k], get_bits(c, k), v[k], one), mask);
        const __m512i n = load(modulus, k);
        put_bits(g, k, _mm512_cmplt_epu64_mask(v[k], n));
        put_bits(p, k, _mm512_cmpeq_epu64_mask(v[k], n));
    }
    lookahead(g, p, c, words);
    const size_t digits = nv * LANES;
    const int below_n = (int)((c[digits / 64] >> (digits % 64)) & 1);
#pragma GCC unroll 32
    for (size_t k = 0; k < nv; k++) {
        __m512i d = v[k];
        if (!below_n) {
            d = _mm512_sub_epi64(d, load(modulus, k));
            d = _mm512_and_si512(_mm512_mask_sub_epi64(d, get_bits(c, k), d, one), mask);
        }
        _mm512_storeu_si512((void *)(out + LANES * k), d);
    }
}

/*
 * The whole multiplication for 8 nv digits: limbs to digits, the AMM loop, reduce(), digits
 * to limbs. acc is written only at the end, after x has been read (so they may alias).
 */
static ALWAYS_INLINE IFMA void mont_mul(uint64_t *acc, const uint64_t *x, const uint64_t *n,
                                        uint64_t k0, size_t nv)
{
    const size_t digits = LANES * nv;
    uint64_t a[PENROSE_IFMA_MAX_DIGITS];
    uint64_t b[PENROSE_IFMA_MAX_DIGITS];
    uint64_t lanes[PENROSE_IFMA_MAX_DIGITS];
    limbs_to_digits(acc, digits, a);
    limbs_to_digits(x, digits, b);
    amm_lanes(lanes, a, b, n, k0, nv);
    reduce(lanes, n, nv, a);
    digits_to_limbs(a, digits, acc);
}

/* The sizes the crate uses (R of 1664, 2496 and 4160 bits), with nv a constant. */
static IFMA void mont_mul_4(uint64_t *acc, const uint64_t *x, const uint64_t *n, uint64_t k0)
{
    mont_mul(acc, x, n, k0, 4);
}

static IFMA void mont_mul_6(uint64_t *acc, const uint64_t *x, const uint64_t *n, uint64_t k0)
{
    mont_mul(acc, x, n, k0, 6);
}

static IFMA void mont_mul_10(uint64_t *acc, const uint64_t *x, const uint64_t *n, uint64_t k0)
{
    mont_mul(acc, x, n, k0, 10);
}

/* Any other size, with the vectors in memory. GCC's -Wmaybe-uninitialized cannot follow the
 * unrolled loops when nv is only known at run time (every array is read only where it was
 * written, for k < nv); the warning is a false positive here and is silenced for this
 * function only. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
static __attribute__((noinline)) IFMA void mont_mul_any(uint64_t *acc, const uint64_t *x,
                                                        const uint64_t *n, uint64_t k0,
                                                        size_t nv)
{
    mont_mul(acc, x, n, k0, nv);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

/*
 * acc = acc * x * R^-1 mod N (R = 2^(52 digits)), fully reduced. acc, x: 13 digits / 16 limbs
 * each, acc < N, x < R; modulus: N as `digits` digits below 2^52, N odd, 4 N < R; k0: -N^-1
 * mod 2^52. acc and x may be the same buffer. Returns 0, or -1 (acc untouched) when `digits`
 * is 0, not a multiple of 16 or above PENROSE_IFMA_MAX_DIGITS. Needs a CPU with avx512f and
 * avx512ifma.
 */
IFMA int penrose_mont_mul_ifma(uint64_t *acc, const uint64_t *x, const uint64_t *modulus,
                               uint64_t k0, size_t digits)
{
    if (digits == 0 || digits % 16 != 0 || digits > PENROSE_IFMA_MAX_DIGITS) {
        return -1;
    }
    const size_t nv = digits / LANES;
    switch (nv) {
    case 4:
        mont_mul_4(acc, x, modulus, k0);
        break;
    case 6:
        mont_mul_6(acc, x, modulus, k0);
        break;
    case 10:
        mont_mul_10(acc, x, modulus, k0);
        break;
    default:
        mont_mul_any(acc, x, modulus, k0, nv);
        break;
    }
    return 0;
}
