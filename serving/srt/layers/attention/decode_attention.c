/* Decode attention over the KV pool in place, for sglang-launch's CPU decode (AVX-512).

   For every row r (one new token) and query head h:
     out[r][h] = sum_j softmax_j(scale * q[r][h] . K[s_j][h / G]) V[s_j][h / G],
   j < lens[r], s_j = slots[r][j], G = heads / kv_heads.
   q, out: [rows][heads][dim] / [rows][heads][v_dim] bfloat16; K, V: the pool's buffers, a slot
   every k_stride / v_stride elements, a head every dim / v_dim; slots: [rows][width] int64.
   Scores and sums are float32; no key or value is copied out of the pool. One (row, key/value
   head) pair per OpenMP iteration. dim and v_dim are multiples of 16, at most 256; G at most 16. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define MAX_DIM 256
#define MAX_GROUP 16

static inline __m512 load_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* e^x for x <= 0 (scores less their maximum), to float32's precision: x = n ln2 + r. */
static inline __m512 exp_le0(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

void sgl_decode_attention(const uint16_t *q, const uint16_t *k, const uint16_t *v,
                          const int64_t *slots, const int64_t *lens, uint16_t *out, int rows,
                          int heads, int kv_heads, int dim, int v_dim, int width, float scale,
                          long k_stride, long v_stride) {
    int group = heads / kv_heads, kd = dim / 16, vd = v_dim / 16;
    int padded = (width + 15) / 16 * 16;
#pragma omp parallel
    {
        float *scores = aligned_alloc(64, sizeof(float) * (size_t)group * padded);
        float qf[MAX_GROUP][MAX_DIM] __attribute__((aligned(64)));
        float acc[MAX_GROUP][MAX_DIM] __attribute__((aligned(64)));
#pragma omp for schedule(static)
        for (int pair = 0; pair < rows * kv_heads; pair++) {
            int row = pair / kv_heads, kvh = pair % kv_heads;
            int len = (int)lens[row];
            const int64_t *row_slots = slots + (size_t)row * width;
            for (int g = 0; g < group; g++) {
                const uint16_t *qh = q + ((size_t)row * heads + kvh * group + g) * dim;
                for (int c = 0; c < kd; c++)
                    _mm512_store_ps(qf[g] + 16 * c, _mm512_mul_ps(load_bf16(qh + 16 * c), _mm512_set1_ps(scale)));
            }
            for (int j = 0; j < len; j++) {
                const uint16_t *kp = k + row_slots[j] * k_stride + (long)kvh * dim;
                __m512 kc[MAX_DIM / 16];
                for (int c = 0; c < kd; c++) kc[c] = load_bf16(kp + 16 * c);
                for (int g = 0; g < group; g++) {
                    __m512 s = _mm512_mul_ps(_mm512_load_ps(qf[g]), kc[0]);
                    for (int c = 1; c < kd; c++) s = _mm512_fmadd_ps(_mm512_load_ps(qf[g] + 16 * c), kc[c], s);
                    scores[(size_t)g * padded + j] = _mm512_reduce_add_ps(s);
                }
            }
            float inv_sum[MAX_GROUP];
            for (int g = 0; g < group; g++) {
                float *sg = scores + (size_t)g * padded;
                for (int j = len; j < (len + 15) / 16 * 16; j++) sg[j] = -INFINITY;
                __m512 mx = _mm512_set1_ps(-INFINITY);
                for (int j = 0; j < len; j += 16) mx = _mm512_max_ps(mx, _mm512_load_ps(sg + j));
                __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
                __m512 sum = _mm512_setzero_ps();
                for (int j = 0; j < len; j += 16) {
                    __mmask16 live = len - j >= 16 ? 0xFFFF : (__mmask16)((1u << (len - j)) - 1);
                    __m512 e = _mm512_maskz_mov_ps(live, exp_le0(_mm512_sub_ps(_mm512_load_ps(sg + j), top)));
                    _mm512_store_ps(sg + j, e);
                    sum = _mm512_add_ps(sum, e);
                }
                inv_sum[g] = 1.0f / _mm512_reduce_add_ps(sum);
                for (int c = 0; c < vd; c++) _mm512_store_ps(acc[g] + 16 * c, _mm512_setzero_ps());
            }
            for (int j = 0; j < len; j++) {
                const uint16_t *vp = v + row_slots[j] * v_stride + (long)kvh * v_dim;
                __m512 vc[MAX_DIM / 16];
                for (int c = 0; c < vd; c++) vc[c] = load_bf16(vp + 16 * c);
                for (int g = 0; g < group; g++) {
                    __m512 p = _mm512_set1_ps(scores[(size_t)g * padded + j]);
                    for (int c = 0; c < vd; c++)
                        _mm512_store_ps(acc[g] + 16 * c, _mm512_fmadd_ps(p, vc[c], _mm512_load_ps(acc[g] + 16 * c)));
                }
            }
            for (int g = 0; g < group; g++) {
                __m512 inv = _mm512_set1_ps(inv_sum[g]);
                uint16_t *oh = out + ((size_t)row * heads + kvh * group + g) * v_dim;
                for (int c = 0; c < vd; c++) {
                    __m256bh o = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_load_ps(acc[g] + 16 * c), inv));
                    _mm256_storeu_si256((__m256i *)(oh + 16 * c), (__m256i)o);
                }
            }
        }
        free(scores);
    }
}
