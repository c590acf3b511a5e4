// A linear layer for decoding and verification on CPUs: y[M, N] = x[M, K] W[N, K]^T (+ b), for the few
// rows (one token, or a draft tree) that decoding forwards carry, over fp32 weights (AVX2) or bf16
// weights (AVX-512 BF16 or AMX, else AVX2: see avx2.h).
//
// Each output is one dot product over K in a fixed order, then the lanes combined in one fixed order,
// the bias added, and the result rounded once to the output dtype:
// - fp32 weights: 8 fp32 lanes, lane l accumulating fma(x[k], w[k], acc) for k = l, l + 8, ... in order;
// - bf16 weights (bf16 inputs), in the kernel's layout (`pack_bf16`): one fp32 accumulator per output,
//   adding x[k] w[k] + x[k+1] w[k+1] for k = 0, 2, 4, ... in order (vdpbf16ps, 16 outputs a vector;
//   with AVX2 alone two FMAs, 8 outputs a vector); no horizontal sums.
// So a row's result does not depend on how many rows the call carries (verification gives a tree node
// what one-token decoding gives it), nor on the number of threads (a thread computes whole outputs).
// oneDNN's bf16 products are not like this on every CPU: on AMD Zen 5 their rows change with the row
// count once K >= 1536 (measured), so bf16 verification needs this kernel there.
// On CPUs with AMX (amx.h) bf16 linears whose K is a multiple of 32 run on the tile unit instead, over
// the same packed tiles: as row-invariant, rounding differently; which path runs depends only on the
// CPU and K (and EAGLESPEC_AMX=0, once per process), so every call of a layer takes the same one. Up
// to 16 rows cost about what one does there; the vector path pays for every row.
//
// A thread takes blocks of weights (fp32: 8 weight rows; bf16: a tile of 64 outputs) and runs every
// input row against them while they sit in its cache: three (fp32) or four (bf16) rows at a time,
// each weight vector serving them all; fp32 runs the rest one at a time, bf16 in groups of one to
// three (five left: three and two).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <algorithm>

#include "amx.h"
#include "avx2.h"
#include "row_groups.h"

#ifdef __AVX2__
#include <immintrin.h>

namespace {

constexpr int64_t LANES = 8;
constexpr int64_t NB = 8;  // outputs per block: a thread computes whole blocks

inline float lane_sum(const float* l) {
  return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

// One row against the NB weight rows wr: lanes [NB][8].
inline void row_block(const float* x, int64_t K, const float* const* wr, float* lanes) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t k = 0; k < K; k += LANES) {
    const __m256 v = _mm256_loadu_ps(x + k);
    a0 = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr[0] + k), a0); a1 = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr[1] + k), a1);
    a2 = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr[2] + k), a2); a3 = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr[3] + k), a3);
    a4 = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr[4] + k), a4); a5 = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr[5] + k), a5);
    a6 = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr[6] + k), a6); a7 = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr[7] + k), a7);
  }
  _mm256_storeu_ps(lanes, a0); _mm256_storeu_ps(lanes + 8, a1); _mm256_storeu_ps(lanes + 16, a2);
  _mm256_storeu_ps(lanes + 24, a3); _mm256_storeu_ps(lanes + 32, a4); _mm256_storeu_ps(lanes + 40, a5);
  _mm256_storeu_ps(lanes + 48, a6); _mm256_storeu_ps(lanes + 56, a7);
}

// Three rows against 4 weight rows: 12 accumulators. lanes [3][NB][8], at the 4 columns' offsets.
inline void three_rows(const float* x, int64_t K, const float* const* wr, float* lanes) {
  const float* x0 = x;
  const float* x1 = x + K;
  const float* x2 = x + 2 * K;
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00,
         a20 = a00, a21 = a00, a22 = a00, a23 = a00;
  for (int64_t k = 0; k < K; k += LANES) {
    const __m256 v0 = _mm256_loadu_ps(x0 + k), v1 = _mm256_loadu_ps(x1 + k), v2 = _mm256_loadu_ps(x2 + k);
    __m256 w = _mm256_loadu_ps(wr[0] + k);
    a00 = _mm256_fmadd_ps(v0, w, a00); a10 = _mm256_fmadd_ps(v1, w, a10); a20 = _mm256_fmadd_ps(v2, w, a20);
    w = _mm256_loadu_ps(wr[1] + k);
    a01 = _mm256_fmadd_ps(v0, w, a01); a11 = _mm256_fmadd_ps(v1, w, a11); a21 = _mm256_fmadd_ps(v2, w, a21);
    w = _mm256_loadu_ps(wr[2] + k);
    a02 = _mm256_fmadd_ps(v0, w, a02); a12 = _mm256_fmadd_ps(v1, w, a12); a22 = _mm256_fmadd_ps(v2, w, a22);
    w = _mm256_loadu_ps(wr[3] + k);
    a03 = _mm256_fmadd_ps(v0, w, a03); a13 = _mm256_fmadd_ps(v1, w, a13); a23 = _mm256_fmadd_ps(v2, w, a23);
  }
  float* l1 = lanes + NB * LANES;
  float* l2 = lanes + 2 * NB * LANES;
  _mm256_storeu_ps(lanes, a00); _mm256_storeu_ps(lanes + 8, a01); _mm256_storeu_ps(lanes + 16, a02);
  _mm256_storeu_ps(lanes + 24, a03); _mm256_storeu_ps(l1, a10); _mm256_storeu_ps(l1 + 8, a11);
  _mm256_storeu_ps(l1 + 16, a12); _mm256_storeu_ps(l1 + 24, a13); _mm256_storeu_ps(l2, a20);
  _mm256_storeu_ps(l2 + 8, a21); _mm256_storeu_ps(l2 + 16, a22); _mm256_storeu_ps(l2 + 24, a23);
}

template <typename O>
void run(const float* x, int64_t M, int64_t K, const float* w, int64_t N, const float* bias, O* y) {
  const int64_t blocks = (N + NB - 1) / NB;
  at::parallel_for(0, blocks, 8, [&](int64_t begin, int64_t end) {
    float lanes[3 * NB * LANES];
    auto write = [&](int64_t m, int64_t n0, const float* l) {
      for (int64_t j = 0; j < NB && n0 + j < N; ++j) {
        float v = lane_sum(l + j * LANES);
        if (bias) v += bias[n0 + j];
        y[m * N + n0 + j] = static_cast<O>(v);
      }
    };
    for (int64_t b = begin; b < end; ++b) {
      const int64_t n0 = b * NB;
      const float* wr[NB];  // past the last output the block repeats row n0 (its results are dropped)
      for (int64_t j = 0; j < NB; ++j) wr[j] = w + (n0 + j < N ? n0 + j : n0) * K;
      int64_t m = 0;
      for (; m + 3 <= M; m += 3) {
        three_rows(x + m * K, K, wr, lanes);
        three_rows(x + m * K, K, wr + 4, lanes + 4 * LANES);
        for (int64_t r = 0; r < 3; ++r) write(m + r, n0, lanes + r * NB * LANES);
      }
      for (; m < M; ++m) {
        row_block(x + m * K, K, wr, lanes);
        write(m, n0, lanes);
      }
    }
  });
}

}  // namespace

// x [M, K] float32 or bfloat16; w [N, K] float32, K % 8 == 0; bias [N] or undefined. Returns y [M, N]
// in x's dtype.
torch::Tensor row_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [M, K] and w [N, K] expected");
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "row_linear runs on CPUs");
  TORCH_CHECK(w.scalar_type() == torch::kFloat, "row_linear weights must be float32");
  TORCH_CHECK(x.size(1) % LANES == 0, "row_linear needs K % 8 == 0");
  const auto out_type = x.scalar_type();
  TORCH_CHECK(out_type == torch::kFloat || out_type == torch::kBFloat16, "row_linear runs float32 and bfloat16");
  auto xf = x.to(torch::kFloat).contiguous();
  auto wc = w.contiguous();
  torch::Tensor b;
  if (bias.has_value() && bias->defined()) b = bias->to(torch::kFloat).contiguous();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  auto y = torch::empty({x.size(0), w.size(0)}, x.options());
  if (out_type == torch::kFloat) run(xf.data_ptr<float>(), x.size(0), x.size(1), wc.data_ptr<float>(), w.size(0), bp,
                                     y.data_ptr<float>());
  else run(xf.data_ptr<float>(), x.size(0), x.size(1), wc.data_ptr<float>(), w.size(0), bp,
           y.data_ptr<at::BFloat16>());
  return y;
}

bool row_linear_available() { return true; }

#else  // no AVX2 (or another architecture): torch's linears run instead (kernels.py asks first)

torch::Tensor row_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(false, "row_linear was built without AVX2");
}

bool row_linear_available() { return false; }

#endif

constexpr int64_t BF16_TILE = 64;  // outputs per tile of the bf16 layout

// w [N, K] bfloat16, K % 2 == 0 -> the kernel's layout [ceil(N / 64), K / 2, 64, 2]: for each tile of
// 64 outputs, the input pairs in order, each pair's weights of the 64 outputs side by side (zeros
// past N), so a tile is one sequential stream.
torch::Tensor pack_bf16(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kBFloat16 && w.size(1) % 2 == 0,
              "pack_bf16 takes bf16 weights [N, K] with K even");
  const int64_t N = w.size(0), K = w.size(1), width = BF16_TILE, tiles = (N + width - 1) / width;
  auto padded = torch::zeros({tiles * width, K}, w.options());
  padded.narrow(0, 0, N).copy_(w);
  return padded.view({tiles, width, K / 2, 2}).permute({0, 2, 1, 3}).contiguous();
}

// row_linear_bf16's operands: x [M, K] bf16 on the CPU, packed from pack_bf16 for K and N outputs.
inline void check_bf16_operands(const torch::Tensor& x, const torch::Tensor& packed, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kBFloat16 && x.device().is_cpu(),
              "row_linear_bf16 takes bf16 inputs [M, K] on the CPU");
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == torch::kBFloat16 && packed.size(1) * 2 == x.size(1) &&
                  packed.size(2) == BF16_TILE && packed.size(3) == 2 && packed.size(0) * BF16_TILE >= N &&
                  packed.is_contiguous(),
              "row_linear_bf16: weights not from pack_bf16 for this input size");
}

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

namespace {

constexpr int64_t COLS = 16;  // outputs per vector (one fp32 lane each)
constexpr int64_t TILE = 4;   // vectors per tile: a thread computes whole tiles of 64 outputs
constexpr int64_t PREFETCH = 4096;  // bytes ahead of the weight stream (1 KiB to 16 KiB measured alike)

// R rows against NT tiles of TILE * COLS outputs each: acc[r][t * TILE + v] lane c accumulates
// output (tiles[t], v, c) of row r over the K / 2 input pairs in order. (Every variant computes an
// output the same way; NT > 1 gives a single row more independent accumulators and weight streams.)
template <int R, int NT>
inline void tile_rows(const at::BFloat16* x, int64_t K, const at::BFloat16* const* tiles, const int64_t* n0,
                      const float* bias, int64_t N, at::BFloat16* y, int64_t ldy) {
  __m512 acc[R][NT * TILE];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NT * TILE; ++v) acc[r][v] = _mm512_setzero_ps();
  const int64_t pairs = K / 2;
  const int32_t* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = reinterpret_cast<const int32_t*>(x + r * K);
  for (int64_t k = 0; k < pairs; ++k) {
    __m512bh xb[R];
    for (int r = 0; r < R; ++r) xb[r] = (__m512bh)_mm512_set1_epi32(xr[r][k]);
    for (int t = 0; t < NT; ++t) {
      const at::BFloat16* wk = tiles[t] + k * TILE * COLS * 2;
      // the weights stream from memory once per call: ask for them PREFETCH bytes ahead
      for (int l = 0; l < TILE * COLS * 2 * 2; l += 64)
        _mm_prefetch(reinterpret_cast<const char*>(wk) + PREFETCH + l, _MM_HINT_T0);
      for (int v = 0; v < TILE; ++v) {
        const __m512bh w = (__m512bh)_mm512_loadu_si512(wk + v * COLS * 2);
        for (int r = 0; r < R; ++r) acc[r][t * TILE + v] = _mm512_dpbf16_ps(acc[r][t * TILE + v], xb[r], w);
      }
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int v = 0; v < TILE; ++v) {
      const int64_t c0 = n0[t] + v * COLS;
      if (c0 >= N) break;
      const int64_t width = N - c0 < COLS ? N - c0 : COLS;
      const __mmask16 keep = static_cast<__mmask16>((1u << width) - 1);
      const __m512 b = bias ? _mm512_maskz_loadu_ps(keep, bias + c0) : _mm512_setzero_ps();
      for (int r = 0; r < R; ++r)
        _mm256_mask_storeu_epi16(y + r * ldy + c0, keep,
                                 (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc[r][t * TILE + v], b)));
    }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
constexpr int64_t AMX_PREFETCH = 4096;  // bytes ahead (one block of a tile; 8 KiB measured alike)

// x [M, K] against the packed tiles on the tile unit (see amx.h): per tile, passes of up to 16 rows.
void amx_linear(const at::BFloat16* xp, int64_t M, int64_t K, const at::BFloat16* wp, int64_t tiles,
                const float* bias, int64_t N, at::BFloat16* yp) {
  constexpr int64_t WIDTH = TILE * COLS, BLOCK = 16 * WIDTH * 2;  // bf16 of a tile's block of 32 inputs
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float out[AMX_ROWS * WIDTH];
    int64_t configured = 0;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n0 = t * WIDTH;
      for (int64_t m0 = 0; m0 < M; m0 += AMX_ROWS) {
        const int64_t rows = M - m0 < AMX_ROWS ? M - m0 : AMX_ROWS;
        if (rows != configured) amx_configure(configured = rows);
        amx_zero();
        for (int64_t b = 0; b < K / 32; ++b) {
          const at::BFloat16* block = wp + t * WIDTH * K + b * BLOCK;
          for (int l = 0; l < BLOCK * 2; l += 64)  // the weights stream from memory: ask for them ahead
            _mm_prefetch(reinterpret_cast<const char*>(block) + AMX_PREFETCH + l, _MM_HINT_T0);
          amx_block(xp + m0 * K + b * 32, K * 2, block);
        }
        amx_store(out);
        for (int64_t c0 = n0; c0 < n0 + WIDTH && c0 < N; c0 += COLS) {
          const int64_t width = N - c0 < COLS ? N - c0 : COLS;
          const __mmask16 keep = static_cast<__mmask16>((1u << width) - 1);
          const __m512 b = bias ? _mm512_maskz_loadu_ps(keep, bias + c0) : _mm512_setzero_ps();
          for (int64_t r = 0; r < rows; ++r)
            _mm256_mask_storeu_epi16(yp + (m0 + r) * N + c0, keep,
                                     (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(_mm512_loadu_ps(out + r * WIDTH + c0 - n0), b)));
        }
      }
    }
    if (configured) _tile_release();
  });
}
#endif

}  // namespace

// x [M, K] bfloat16; packed from pack_bf16 (N outputs); bias [N] or undefined. Returns y [M, N] bf16.
torch::Tensor row_linear_bf16(torch::Tensor x, torch::Tensor packed, int64_t N, c10::optional<torch::Tensor> bias) {
  check_bf16_operands(x, packed, N);
  const int64_t M = x.size(0), K = x.size(1);
  auto xc = x.contiguous();
  torch::Tensor b;
  if (bias.has_value() && bias->defined()) b = bias->to(torch::kFloat).contiguous();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  auto y = torch::empty({M, N}, x.options());
  const at::BFloat16* xp = xc.data_ptr<at::BFloat16>();
  const at::BFloat16* wp = packed.data_ptr<at::BFloat16>();
  at::BFloat16* yp = y.data_ptr<at::BFloat16>();
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if (K % 32 == 0 && amx_on()) {
    amx_linear(xp, M, K, wp, packed.size(0), bp, N, yp);
    return y;
  }
#endif
  at::parallel_for(0, packed.size(0), 1, [&](int64_t begin, int64_t end) {
    // tiles in pairs (t, t + half) of this thread's range; one or two rows run against both at once
    const int64_t half = (end - begin + 1) / 2;
    for (int64_t t = begin; t < begin + half; ++t) {
      const int64_t count = t + half < end ? 2 : 1;
      const at::BFloat16* tile[2] = {wp + t * TILE * COLS * K, wp + (t + half) * TILE * COLS * K};
      const int64_t n0[2] = {t * TILE * COLS, (t + half) * TILE * COLS};
      for_row_groups(M, [&](int64_t m, auto group) {
        constexpr int R = decltype(group)::value;
        const at::BFloat16* xm = xp + m * K;
        at::BFloat16* ym = yp + m * N;
        if constexpr (R <= 2) {
          if (count == 2) return tile_rows<R, 2>(xm, K, tile, n0, bp, N, ym, N);
        }
        for (int64_t i = 0; i < count; ++i) tile_rows<R, 1>(xm, K, tile + i, n0 + i, bp, N, ym, N);
      });
    }
  });
  return y;
}

bool row_linear_bf16_available() { return true; }

std::string row_linear_bf16_unit() { return amx_on() ? "amx" : "avx512-bf16"; }

#elif defined(__AVX2__)  // bf16 products in fp32 lanes (see avx2.h)

namespace {

// Bytes ahead of a pass's weight stream. A group of rows passes over a tile once per V vectors, each
// pass reading one cache line of every 256 bytes, and several rows' arithmetic per line: 4 KiB ahead
// came too late there (SmolLM2's layer matrices, 4 rows: 18.8 ms at 4 KiB, 16.6 at 32 KiB, 16.4 at
// 64 KiB; one row 11 ms at each; ad hoc, AMD Zen 2, 2 threads).
constexpr int64_t AVX2_PREFETCH = 65536;

// Pairs of inputs per block: a group of rows makes all its passes over a block of the tile (16 KiB,
// in L1 after the first) before the next block, rather than each pass over the whole tile
// (SmolLM2's layer matrices, ad hoc, AMD Zen 2, 2 threads: 4 rows 16.5-17.1 -> 15.2-16.2 ms; 1 and 2
// rows unchanged within noise, about 11 and 12.5 ms).
constexpr int64_t AVX2_BLOCK = 64;

// R rows (fp32) against V vectors of 8 outputs of a tile, from vector `first` on, over the input
// pairs [p0, p1): per output one fp32 chain over the inputs in order, carried between blocks in
// `acc` ([R][8 vectors][8 lanes]), the packed pair (w[2p], w[2p + 1]) of 8 outputs one 32-byte load.
template <int R, int V>
__attribute__((noinline)) void bf16_rows(const float* x, int64_t K, const at::BFloat16* tile, int first, int64_t p0,
                                         int64_t p1, float* acc) {
  __m256 a[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) a[r][v] = _mm256_load_ps(acc + (r * 8 + first + v) * 8);
  const __m256i high = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  for (int64_t p = p0; p < p1; ++p) {
    const at::BFloat16* wp = tile + p * BF16_TILE * 2 + first * 16;
    for (int l = 0; l < V * 32; l += 64) _mm_prefetch(reinterpret_cast<const char*>(wp) + l + AVX2_PREFETCH, _MM_HINT_T0);
    __m256 even[R], odd[R];
    for (int r = 0; r < R; ++r) {
      even[r] = _mm256_broadcast_ss(x + r * K + 2 * p);
      odd[r] = _mm256_broadcast_ss(x + r * K + 2 * p + 1);
    }
    for (int v = 0; v < V; ++v) {
      const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + v * 16));
      const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
      const __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(pairs, high));
      for (int r = 0; r < R; ++r) {
        a[r][v] = _mm256_fmadd_ps(even[r], we, a[r][v]);
        a[r][v] = _mm256_fmadd_ps(odd[r], wo, a[r][v]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) _mm256_store_ps(acc + (r * 8 + first + v) * 8, a[r][v]);
}

// A group's outputs of a tile (n0 on), from its accumulators, plus the bias: rounded once to bf16.
template <int R>
void bf16_store(const float* acc, const float* bias, int64_t n0, int64_t N, at::BFloat16* y, int64_t ldy) {
  for (int v = 0; v < 8; ++v) {
    const int64_t c0 = n0 + v * 8;
    if (c0 >= N) break;
    const int64_t width = N - c0 < 8 ? N - c0 : 8;
    __m256 b = _mm256_setzero_ps();
    if (bias) {
      alignas(32) float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t i = 0; i < width; ++i) lanes[i] = bias[c0 + i];
      b = _mm256_load_ps(lanes);
    }
    for (int r = 0; r < R; ++r) store_bf16(y + r * ldy + c0, _mm256_add_ps(_mm256_load_ps(acc + (r * 8 + v) * 8), b), width);
  }
}

}  // namespace

torch::Tensor row_linear_bf16(torch::Tensor x, torch::Tensor packed, int64_t N, c10::optional<torch::Tensor> bias) {
  check_bf16_operands(x, packed, N);
  const int64_t M = x.size(0), K = x.size(1);
  auto xf = x.to(torch::kFloat).contiguous();  // exact
  torch::Tensor b;
  if (bias.has_value() && bias->defined()) b = bias->to(torch::kFloat).contiguous();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  auto y = torch::empty({M, N}, x.options());
  const float* xp = xf.data_ptr<float>();
  const at::BFloat16* wp = packed.data_ptr<at::BFloat16>();
  at::BFloat16* yp = y.data_ptr<at::BFloat16>();
  at::parallel_for(0, packed.size(0), 1, [&](int64_t begin, int64_t end) {
    alignas(32) float acc[4 * 8 * 8];
    for (int64_t t = begin; t < end; ++t)
      for_row_groups(M, [&](int64_t m, auto rows) {
        constexpr int R = decltype(rows)::value, V = Fp32Vectors<R>::value;
        std::fill(acc, acc + R * 64, 0.0f);
        for (int64_t p0 = 0; p0 < K / 2; p0 += AVX2_BLOCK)
          for (int first = 0; first < 8; first += V)
            bf16_rows<R, V>(xp + m * K, K, wp + t * BF16_TILE * K, first, p0, std::min(p0 + AVX2_BLOCK, K / 2), acc);
        bf16_store<R>(acc, bp, t * BF16_TILE, N, yp + m * N, N);
      });
  });
  return y;
}

bool row_linear_bf16_available() { return true; }

std::string row_linear_bf16_unit() { return "avx2"; }

#else  // no AVX2: bf16 linears run torch's (kernels.py asks first)

torch::Tensor row_linear_bf16(torch::Tensor x, torch::Tensor packed, int64_t N, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(false, "row_linear_bf16 was built without AVX2");
}

bool row_linear_bf16_available() { return false; }

std::string row_linear_bf16_unit() { return "none"; }

#endif
