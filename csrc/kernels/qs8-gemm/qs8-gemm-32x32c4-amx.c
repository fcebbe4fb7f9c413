/* qs8-gemm, 32 rows x 32 columns, k in groups of 4, Intel AMX (TDPBSSD) with AVX-512
 * requantization. Eight tile registers, all 16 rows x 64 bytes: four int32 accumulators
 * (C[rows 0-15 | 16-31][columns 0-15 | 16-31]), two activation tiles (16 rows x 64 k) and two
 * weight tiles (16 groups of 4 k x 16 columns). One TDPBSSD is 16 x 16 x 64 multiply-adds.
 *
 * The packing is the c4 layout of kernels.h with nr = 32: group g of a block is 32 columns x
 * 4 bytes, so its first 64 bytes are columns 0-15 (a weight tile row, stride 128) and the next
 * 64 columns 16-31. TDPBSSD multiplies signed by signed bytes: activations enter as they are
 * (a_offset 0, ek_qs8_gemm_a_offset), so every accumulator equals the scalar reference's.
 *
 * Tiles never read past the caller's buffers: the last chunk's weight groups go through a
 * zero-padded copy, and a read of A's last row past k through a copy of those rows.
 * Each call loads the tile configuration and releases the tiles at its end (the tile state is
 * per thread; a released state costs nothing at a context switch). The process needs the
 * kernel's permission for the tile data (arch_prctl ARCH_REQ_XCOMP_PERM; cpu.h asks for it
 * when it detects AMX). */
#include "edgekit/kernels.h"

#if EK_ENABLE_AMX
#include <immintrin.h>
#include <string.h>

#include "../common/requant-avx512.h"

struct ek_tilecfg {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

/* tile numbers: accumulators 0-3, activations 4-5, weights 6-7 */
#define EK_C00 0
#define EK_C01 1
#define EK_C10 2
#define EK_C11 3
#define EK_A0 4
#define EK_A1 5
#define EK_B0 6
#define EK_B1 7

/* 16 rows of activations, row r = a + (i0 + r) * a_stride, bytes [kk, kk + cb): straight from
 * memory unless the last of those rows is A's last and the read passes k (the bytes past k of
 * any other row are the next row's or padding; they meet zero weights), else through buf */
static inline const int8_t* ek_amx_a_rows(const int8_t* a, size_t a_stride, size_t i0, size_t m, size_t kk, size_t cb,
                                          size_t k, int8_t* buf, size_t* stride) {
  if (i0 + 16 < m || (i0 + 16 == m && kk + cb <= k)) {
    *stride = a_stride;
    return a + i0 * a_stride + kk;
  }
  const size_t len = k - kk < cb ? k - kk : cb;
  for (size_t r = 0; r < 16 && i0 + r < m; r++) memcpy(buf + r * 64, a + (i0 + r) * a_stride + kk, len);
  *stride = 64;
  return buf; /* rows past m: whatever an earlier copy left (their outputs are not stored) */
}

/* one 16 x 16 accumulator tile (in buf) + bias -> requantized int8 rows [i0, i0 + rows) */
static inline void ek_amx_store(const int32_t* buf, size_t rows, __m512i bias, const struct ek_rq_avx512* rq, __m256i vzp,
                                __m128i vqmin, __m128i vqmax, __mmask16 mask, int8_t* c, size_t c_stride) {
  for (size_t r = 0; r < rows; r++) {
    const __m512i acc = _mm512_add_epi32(_mm512_loadu_si512(buf + r * 16), bias);
    _mm_mask_storeu_epi8(c + r * c_stride, mask, ek_avx512_narrow16(ek_avx512_mul_by_multiplier(acc, rq), vzp, vqmin, vqmax));
  }
}

/* what requantizing one column block needs */
struct ek_amx_cols {
  struct ek_rq_avx512 ra, rb;
  __m512i bias_a, bias_b;
  __mmask16 ma, mb;
  size_t nj;
};

/* the four accumulator tiles of rows [i, i + 32) (stored in acc) -> int8 */
static inline void ek_amx_requant_block(const int32_t acc[4][16 * 16], size_t i, size_t m, const struct ek_amx_cols* cb,
                                        __m256i vzp, __m128i vqmin, __m128i vqmax, int8_t* c, size_t c_stride) {
  const size_t rows0 = m - i < 16 ? m - i : 16;
  ek_amx_store(acc[0], rows0, cb->bias_a, &cb->ra, vzp, vqmin, vqmax, cb->ma, c, c_stride);
  if (cb->nj > 16) ek_amx_store(acc[1], rows0, cb->bias_b, &cb->rb, vzp, vqmin, vqmax, cb->mb, c + 16, c_stride);
  if (i + 16 < m) {
    const size_t rows1 = m - i - 16 < 16 ? m - i - 16 : 16;
    int8_t* c1 = c + 16 * c_stride;
    ek_amx_store(acc[2], rows1, cb->bias_a, &cb->ra, vzp, vqmin, vqmax, cb->ma, c1, c_stride);
    if (cb->nj > 16) ek_amx_store(acc[3], rows1, cb->bias_b, &cb->rb, vzp, vqmin, vqmax, cb->mb, c1 + 16, c_stride);
  }
}

void ek_qs8_gemm_ukernel_32x32c4__amx(size_t m, size_t n, size_t k, const int8_t* a, size_t a_stride,
                                      const void* packed_w, int8_t* c, size_t c_stride,
                                      const struct ek_requant_params* rq) {
  const size_t k_pad = (k + 3) & ~(size_t)3;
  const size_t groups = k_pad / 4;
  const size_t block_bytes = 32 * sizeof(int32_t) + k_pad * 32;
  const size_t chunks = (groups + 15) / 16;
  /* chunks whose weight groups are all in the block (the one chunk of k <= 64 is) */
  const size_t full_chunks = chunks == 1 ? 1 : groups / 16;
  const __m256i vzp = _mm256_set1_epi16((int16_t)rq->zp_out);
  const __m128i vqmin = _mm_set1_epi8((int8_t)rq->qmin), vqmax = _mm_set1_epi8((int8_t)rq->qmax);

  /* k <= 64 (one chunk): activation tiles k_pad bytes wide, weight tiles k_pad / 4 rows, so
   * a small k costs no zero padding; longer k: 64-byte chunks, the last zero-padded (btail) */
  const size_t cb = chunks == 1 ? k_pad : 64;
  struct ek_tilecfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) {
    cfg.rows[t] = (uint8_t)(t >= EK_B0 && chunks == 1 ? groups : 16);
    cfg.colsb[t] = (uint16_t)(t == EK_A0 || t == EK_A1 ? cb : 64);
  }
  _tile_loadconfig(&cfg);

  _Alignas(64) int8_t abuf[2][16 * 64];
  _Alignas(64) int8_t btail[16 * 128]; /* the last chunk's weight groups, zero past the block */
  /* accumulators of two row blocks: block i's are requantized while block i + 1's multiply */
  _Alignas(64) int32_t acc[2][4][16 * 16];
  memset(abuf, 0, sizeof abuf);

  const uint8_t* w = (const uint8_t*)packed_w;
  for (size_t j0 = 0; j0 < n; j0 += 32, w += block_bytes) {
    const size_t nj = n - j0 < 32 ? n - j0 : 32;
    struct ek_amx_cols col;
    col.nj = nj;
    col.ma = (__mmask16)(nj >= 16 ? 0xFFFFu : (1u << nj) - 1u);
    col.mb = (__mmask16)(nj <= 16 ? 0u : nj == 32 ? 0xFFFFu : (1u << (nj - 16)) - 1u);
    col.ra = ek_rq_avx512_init(_mm512_maskz_loadu_epi32(col.ma, rq->multiplier + j0),
                               _mm512_maskz_loadu_epi32(col.ma, rq->shift + j0));
    col.rb = ek_rq_avx512_init(_mm512_maskz_loadu_epi32(col.mb, rq->multiplier + j0 + 16),
                               _mm512_maskz_loadu_epi32(col.mb, rq->shift + j0 + 16));
    col.bias_a = _mm512_loadu_si512(w);
    col.bias_b = _mm512_loadu_si512(w + 64);
    const int8_t* wk = (const int8_t*)(w + 128);
    if (full_chunks < chunks) {
      memset(btail, 0, sizeof btail);
      memcpy(btail, wk + full_chunks * 16 * 128, (groups - full_chunks * 16) * 128);
    }

    const int wide = nj > 16; /* a second column tile */
    int cur = 0;
    for (size_t i = 0; i < m; i += 32) {
      const int two = i + 16 < m; /* a second row tile */
      _tile_zero(EK_C00);
      _tile_zero(EK_C01);
      _tile_zero(EK_C10);
      _tile_zero(EK_C11);
      for (size_t ch = 0; ch < chunks; ch++) {
        const size_t kk = ch * 64;
        size_t sa0, sa1;
        const int8_t* a0 = ek_amx_a_rows(a, a_stride, i, m, kk, cb, k, abuf[0], &sa0);
        const int8_t* b = ch < full_chunks ? wk + ch * 16 * 128 : btail;
        _tile_loadd(EK_A0, a0, sa0);
        _tile_loadd(EK_B0, b, 128);
        _tile_dpbssd(EK_C00, EK_A0, EK_B0);
        if (wide) {
          _tile_loadd(EK_B1, b + 64, 128);
          _tile_dpbssd(EK_C01, EK_A0, EK_B1);
        }
        if (two) {
          const int8_t* a1 = ek_amx_a_rows(a, a_stride, i + 16, m, kk, cb, k, abuf[1], &sa1);
          _tile_loadd(EK_A1, a1, sa1);
          _tile_dpbssd(EK_C10, EK_A1, EK_B0);
          if (wide) _tile_dpbssd(EK_C11, EK_A1, EK_B1);
        }
      }
      /* the previous block's requantization overlaps this block's multiplies (its tile stores
       * would wait for them; reading an accumulator right after its tile store stalls) */
      if (i > 0) ek_amx_requant_block(acc[cur ^ 1], i - 32, m, &col, vzp, vqmin, vqmax, c + (i - 32) * c_stride + j0, c_stride);
      _tile_stored(EK_C00, acc[cur][0], 64);
      if (wide) _tile_stored(EK_C01, acc[cur][1], 64);
      if (two) {
        _tile_stored(EK_C10, acc[cur][2], 64);
        if (wide) _tile_stored(EK_C11, acc[cur][3], 64);
      }
      cur ^= 1;
    }
    const size_t last = (m - 1) / 32 * 32;
    ek_amx_requant_block(acc[cur ^ 1], last, m, &col, vzp, vqmin, vqmax, c + last * c_stride + j0, c_stride);
  }
  _tile_release();
}
#endif
