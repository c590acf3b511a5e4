// What our linear kernels' AVX2 paths share (CPUs without AVX-512 BF16: the bf16 and int4 kernels,
// and int8 where AVX-512 is missing too). They read the same packed layouts as the AVX-512 paths.
// A group of R rows runs against V of a tile's vectors at a time (passes over the tile, the tile in
// cache after the first; the bf16 kernel makes its passes block by block of the tile), so that its
// accumulators fit the 16 registers: in the fp32 paths
// (`Fp32Vectors`) a tile of 64 outputs is 8 vectors of 8 fp32 lanes, one lane per output; in the
// integer path of int4 (`Int16Vectors`) 4 vectors of 16 int16 lanes. Every (R, V) computes an output
// the same way, so a row's result does not depend on the rows beside it nor on the number of threads.

#pragma once

#if defined(__AVX2__)
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/extension.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "row_groups.h"

// Of a tile's 8 vectors of 8 fp32 outputs, the number a group of R rows takes per pass.
template <int R>
struct Fp32Vectors {
  static constexpr int tile = 8, value = R == 1 ? 8 : R == 2 ? 4 : 2;
};

// Of a tile's 4 vectors of 16 int16 outputs, the number a group of R rows takes per pass (two
// accumulators each).
template <int R>
struct Int16Vectors {
  static constexpr int tile = 4, value = R == 1 ? 4 : R == 2 ? 2 : 1;
};

// The passes of a call of M rows over `tiles` tiles, the tiles split over the threads:
// pass(tile, first row, first vector, rows, vectors), rows and vectors as integral constants.
template <template <int> class Vectors, typename F>
inline void avx2_passes(int64_t M, int64_t tiles, F&& pass) {
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for_row_groups(M, [&](int64_t m, auto rows) {
        using Pass = Vectors<decltype(rows)::value>;
        for (int first = 0; first < Pass::tile; first += Pass::value)
          pass(t, m, first, rows, std::integral_constant<int, Pass::value>());
      });
  });
}

// The inputs x [M, K] (bf16) as 8-bit integers, per row and group of 32 inputs: codes
// c = round(x / d) with d = max |x| / 127 over the group (0 and codes 0 for a group of zeros), as
// llama.cpp's CPU kernels quantize activations, and the sum of the rounded inputs, d sum c. A kernel
// that takes them multiplies the rounded inputs d c exactly; each row's numbers depend on that row
// alone.
struct Int8Rows {
  std::vector<int8_t> codes;  // [M, K]
  std::vector<float> scale;   // [M, K / 32]: d
  std::vector<float> sum;     // [M, K / 32]: d sum c

  Int8Rows(const at::BFloat16* x, int64_t M, int64_t K) : codes(M * K), scale(M * K / 32), sum(M * K / 32) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes the packs' lane interleaving
    for (int64_t g = 0; g < M * K / 32; ++g) {
      const uint16_t* bits = reinterpret_cast<const uint16_t*>(x) + g * 32;
      __m256 f[4];
      for (int i = 0; i < 4; ++i)
        f[i] = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bits + 8 * i))), 16));
      const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, f[0]), _mm256_andnot_ps(sign, f[1])),
                                     _mm256_max_ps(_mm256_andnot_ps(sign, f[2]), _mm256_andnot_ps(sign, f[3])));
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, m);
      float amax = 0.0f;
      for (int i = 0; i < 8; ++i) amax = lanes[i] > amax ? lanes[i] : amax;
      const __m256 inverse = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
      __m256i c[4];
      for (int i = 0; i < 4; ++i) c[i] = _mm256_cvtps_epi32(_mm256_mul_ps(f[i], inverse));  // nearest even
      alignas(32) int32_t totals[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(totals),
                         _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3])));
      int32_t total = 0;
      for (int i = 0; i < 8; ++i) total += totals[i];
      scale[g] = amax / 127.0f;
      sum[g] = scale[g] * static_cast<float>(total);
      const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes.data() + g * 32),
                          _mm256_permutevar8x32_epi32(packed, order));
    }
  }
};

// Outputs c0 .. c0 + width - 1 (width <= 8) of a row: v rounded once to bf16 (nearest even).
inline void store_bf16(at::BFloat16* y, __m256 v, int64_t width) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  for (int64_t i = 0; i < width; ++i) y[i] = static_cast<at::BFloat16>(lanes[i]);
}

#endif
