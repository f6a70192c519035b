/* int4 and int8 weight-only matrix products on AMX (bfloat16 tiles), for sglang-launch's CPU
   decode.

   y[M][N] = x[M][K] @ W^T (+ bias), x, y and bias in bfloat16, W in int4 groups along K:
   w[n][k] = (q[n][k] - 8) * scale[n][g] + zero[n][g], g = k / group (group a multiple of 32).

   Layouts (made by amx.py's int4_layout):
   - q: [N/16][K/2][16] bytes. Row r of a 16-column block holds the tile row of k = 2r, 2r+1 in
     AMX's pair (VNNI) order, lane L = 2 * n + (k - 2r) for its 16 columns n: byte j holds lane j
     in its low nibble and lane j + 16 in its high nibble.
   - sz: [N/16][K/group][2][16] bfloat16: the block's 16 scales, then its 16 zeros, per group.
   int8 (w[n][k] = q[n][k] * scale[n]): q [N/16][K/2][32] int8, the 32 lanes of a tile row in
   order; sz [N/16][16] bfloat16, the block's scales.

   Each 16-column block is turned into bfloat16 once per call (the value the dense copy of the
   layer holds: one rounding of (q - 8) * scale + zero) and multiplied with every 16 rows of x
   by the tile unit; blocks are shared among OpenMP threads in pairs. */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Ask the kernel for the tile state (0: granted). */
int sgl_amx_init(void) {
    return (int)syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
}

typedef struct {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Tiles 0, 1: two 16-column blocks of C (fp32); 2: 32 k of x's rows; 3, 4: the blocks' W. */
static void configure(int mrows) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 3; t++) {
        cfg.rows[t] = (uint8_t)mrows;
        cfg.colsb[t] = 64;
    }
    cfg.rows[3] = cfg.rows[4] = 16;
    cfg.colsb[3] = cfg.colsb[4] = 64;
    _tile_loadconfig(&cfg);
}

static __m512 bf16_to_fp32(const uint16_t *p) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

/* One 16-column block of W into buf: [K/2][32] bfloat16, tile rows in pair order. */
static void unpack_block(const uint8_t *q, const uint16_t *sz, int K, int group, uint16_t *buf) {
    const __m512i first = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i second = _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
    const __m512i low4 = _mm512_set1_epi32(0xF);
    const __m512i exponent = _mm512_set1_epi32(0x4B000000); /* the float 2^23 + its low bits */
    const __m512 offset = _mm512_set1_ps(8388616.0f);       /* 2^23 + 8 */
    __m512 s_lo = _mm512_setzero_ps(), s_hi = s_lo, z_lo = s_lo, z_hi = s_lo;
    int loaded = -1;
    for (int row = 0; row < K / 2; row++) {
        int g = (row * 2) / group;
        if (g != loaded) {
            const uint16_t *s = sz + (size_t)g * 32;
            __m512 scale = bf16_to_fp32(s), zero = bf16_to_fp32(s + 16);
            s_lo = _mm512_permutexvar_ps(first, scale);
            s_hi = _mm512_permutexvar_ps(second, scale);
            z_lo = _mm512_permutexvar_ps(first, zero);
            z_hi = _mm512_permutexvar_ps(second, zero);
            loaded = g;
        }
        __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + (size_t)row * 16)));
        __m512 lo = _mm512_castsi512_ps(_mm512_or_si512(_mm512_and_si512(d, low4), exponent));
        __m512 hi = _mm512_castsi512_ps(_mm512_or_si512(_mm512_srli_epi32(d, 4), exponent));
        lo = _mm512_fmadd_ps(_mm512_sub_ps(lo, offset), s_lo, z_lo);
        hi = _mm512_fmadd_ps(_mm512_sub_ps(hi, offset), s_hi, z_hi);
        _mm512_storeu_si512((void *)(buf + (size_t)row * 32), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
}

/* One 16-column block of int8 W into buf: q8 [K/2][32] int8 in pair order (lanes 0-15 then
   16-31, lane L = 2 * n + (k - 2r)), w = q * scale[n]; scale: the block's 16 bfloat16. */
static void unpack_block_int8(const uint8_t *q, const uint16_t *scale, int K, int group, uint16_t *buf) {
    const __m512i first = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i second = _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
    (void)group;
    __m512 s = bf16_to_fp32(scale);
    __m512 s_lo = _mm512_permutexvar_ps(first, s), s_hi = _mm512_permutexvar_ps(second, s);
    for (int row = 0; row < K / 2; row++) {
        const uint8_t *p = q + (size_t)row * 32;
        __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
        __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 16))));
        lo = _mm512_mul_ps(lo, s_lo);
        hi = _mm512_mul_ps(hi, s_hi);
        _mm512_storeu_si512((void *)(buf + (size_t)row * 32), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
}

static void store_block(const float *c, int mrows, uint16_t *y, int N, int n0, const uint16_t *bias) {
    __m512 b = bias ? bf16_to_fp32(bias + n0) : _mm512_setzero_ps();
    for (int m = 0; m < mrows; m++) {
        __m256bh out = _mm512_cvtneps_pbh(_mm512_add_ps(_mm512_loadu_ps(c + m * 16), b));
        _mm256_storeu_si256((__m256i *)(y + (size_t)m * N + n0), (__m256i)out);
    }
}

typedef void (*unpack_fn)(const uint8_t *, const uint16_t *, int, int, uint16_t *);

/* y = x @ W^T (+ bias) for blocks of q_block bytes and sz_block scales, unpacked by unpack. */
static void amx_mm(const uint16_t *x, const uint8_t *q, const uint16_t *sz, const uint16_t *bias,
                   uint16_t *y, int M, int N, int K, int group, unpack_fn unpack, size_t q_block,
                   size_t sz_block) {
    int blocks = N / 16, pairs = (blocks + 1) / 2;
#pragma omp parallel
    {
        uint16_t *w0 = aligned_alloc(64, (size_t)K * 64), *w1 = w0 + (size_t)K * 16;
        float c[2][256] __attribute__((aligned(64)));
        int configured = -1;
#pragma omp for schedule(static)
        for (int p = 0; p < pairs; p++) {
            int b0 = 2 * p, two = b0 + 1 < blocks;
            unpack(q + b0 * q_block, sz + b0 * sz_block, K, group, w0);
            if (two) unpack(q + (b0 + 1) * q_block, sz + (b0 + 1) * sz_block, K, group, w1);
            for (int m0 = 0; m0 < M; m0 += 16) {
                int mrows = M - m0 < 16 ? M - m0 : 16;
                if (mrows != configured) {
                    configure(mrows);
                    configured = mrows;
                }
                _tile_zero(0);
                _tile_zero(1);
                for (int k0 = 0; k0 < K; k0 += 32) {
                    _tile_loadd(2, x + (size_t)m0 * K + k0, K * 2);
                    _tile_loadd(3, w0 + (size_t)k0 * 16, 64);
                    _tile_dpbf16ps(0, 2, 3);
                    if (two) {
                        _tile_loadd(4, w1 + (size_t)k0 * 16, 64);
                        _tile_dpbf16ps(1, 2, 4);
                    }
                }
                _tile_stored(0, c[0], 64);
                store_block(c[0], mrows, y + (size_t)m0 * N, N, b0 * 16, bias);
                if (two) {
                    _tile_stored(1, c[1], 64);
                    store_block(c[1], mrows, y + (size_t)m0 * N, N, (b0 + 1) * 16, bias);
                }
            }
        }
        if (configured >= 0) _tile_release();
        free(w0);
    }
}

/* int4: N a multiple of 16, K of 32, group a multiple of 32 dividing K (layouts above). */
void sgl_amx_int4_mm(const uint16_t *x, const uint8_t *q, const uint16_t *sz, const uint16_t *bias,
                     uint16_t *y, int M, int N, int K, int group) {
    amx_mm(x, q, sz, bias, y, M, N, K, group, unpack_block, (size_t)(K / 2) * 16,
           (size_t)(K / group) * 32);
}

/* int8 with a scale per output column: N a multiple of 16, K of 32; sz: [N/16][16] bfloat16. */
void sgl_amx_int8_mm(const uint16_t *x, const uint8_t *q, const uint16_t *sz, const uint16_t *bias,
                     uint16_t *y, int M, int N, int K) {
    amx_mm(x, q, sz, bias, y, M, N, K, K, unpack_block_int8, (size_t)(K / 2) * 32, 16);
}
