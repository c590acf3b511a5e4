// What our linear kernels' AVX2 paths share (CPUs without AVX-512 BF16: the bf16 and int4 kernels,
// and int8 where AVX-512 is missing too). They read the same packed layouts as the AVX-512 paths,
// a tile of 64 outputs as 8 vectors of 8 fp32 lanes, one lane per output: a group of R rows runs
// against V of the vectors at a time (8 / V passes over the tile, the tile in cache after the
// first), so that R x V accumulators fit the 16 registers. Every (R, V) computes an output the same
// way, one fp32 chain over the inputs in order, so a row's result does not depend on the rows beside
// it nor on the number of threads.

#pragma once

#if defined(__AVX2__)
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/extension.h>

#include <cstdint>
#include <type_traits>

#include "row_groups.h"

// Vectors of 8 outputs a group of R rows takes per pass.
template <int R>
constexpr int avx2_vectors() { return R == 1 ? 8 : R == 2 ? 4 : 2; }

// The passes of a call of M rows over `tiles` tiles, the tiles split over the threads:
// pass(tile, first row, first vector, rows, vectors), rows and vectors as integral constants.
template <typename F>
inline void avx2_passes(int64_t M, int64_t tiles, F&& pass) {
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for_row_groups(M, [&](int64_t m, auto rows) {
        constexpr int V = avx2_vectors<decltype(rows)::value>();
        for (int first = 0; first < 8; first += V) pass(t, m, first, rows, std::integral_constant<int, V>());
      });
  });
}

// Outputs c0 .. c0 + width - 1 (width <= 8) of a row: v rounded once to bf16 (nearest even).
inline void store_bf16(at::BFloat16* y, __m256 v, int64_t width) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  for (int64_t i = 0; i < width; ++i) y[i] = static_cast<at::BFloat16>(lanes[i]);
}

#endif
