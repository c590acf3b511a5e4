// A linear layer over 4-bit weights for decoding and verification on CPUs with AVX-512 BF16 (else AVX2):
// y[M, N] = x[M, K] W[N, K]^T, x bf16, W in groups of 32 inputs w = q * scale + low (q in 0..15,
// scale and low fp16 per output and group: GGUF Q4_1's own d and m), y bf16.
//
// The codes are never expanded to bf16 weights in memory. In registers a code q becomes the bf16
// number 128 + q (the bits 0x4300 | q: exact), so a vdpbf16ps over a group gives, per output,
// a = sum x[k] (128 + q[k]) with exact products, and the group adds scale * a + (low - 128 scale) * s,
// where s = sum x[k] over the group (computed once per row). Each output is one fixed sequence of
// operations over the input pairs and the groups in order, so a row's result does not depend on how
// many rows the call carries (verification gives a tree node what one-token decoding gives it) nor
// on the number of threads. The codes stream from memory once per call: a tile of 64 outputs is
// read for every row group while it sits in cache, up to four rows sharing each code vector, so a
// forward over a few draft tokens costs little more than over one.
//
// On CPUs with AMX (see amx.h) the group sums a come from the tile unit instead, the codes turned into
// 128 + q once per tile and group for every row of the call: a forward over 16 rows costs about 2x
// one row there, where the vector path's cost grows with every row group.
//
// Layout (`pack_int4`): for each tile of 64 outputs and each group of 32 inputs, 1280 bytes: the
// codes of the group's 16 input pairs (64 bytes a pair: two halves of 32 bytes; in half h, byte j's
// low nibble is element j of vector 2h and its high nibble element j of vector 2h + 1, where element
// j of vector v is output 16 v + j / 2 at input 2 p + j % 2), then the 64 scales and the 64 lows (fp16).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "amx.h"
#include "avx2.h"
#include "row_groups.h"

namespace {

constexpr int64_t GROUP = 32;
constexpr int64_t TILE_OUT = 64;
constexpr int64_t CODE_BYTES = GROUP / 2 * 64;           // 16 pairs x 64 bytes
constexpr int64_t BLOCK = CODE_BYTES + 2 * TILE_OUT * 2;  // codes, scales, lows

}  // namespace

// codes [N, K] integers 0..15, scale and low [K / 32, N] (any float dtype, rounded to fp16) -> the
// kernel's layout [ceil(N / 64), K / 32, 1280] uint8 (outputs past N get zero codes and parameters).
torch::Tensor pack_int4(torch::Tensor codes, torch::Tensor scale, torch::Tensor low) {
  TORCH_CHECK(codes.dim() == 2 && codes.size(1) % GROUP == 0, "pack_int4: codes [N, K] with K % 32 == 0");
  const int64_t N = codes.size(0), K = codes.size(1), G = K / GROUP, T = (N + TILE_OUT - 1) / TILE_OUT;
  TORCH_CHECK(scale.sizes() == low.sizes() && scale.size(0) == G && scale.size(1) == N,
              "pack_int4: scale and low [K / 32, N]");
  auto c = torch::zeros({T * TILE_OUT, K}, codes.options().dtype(torch::kUInt8));
  c.narrow(0, 0, N).copy_(codes);
  // (t, v, c16, g, p, parity) -> (t, g, p, half, v % 2, element): per pair the 4 vectors of 32 elements
  auto e = c.view({T, 4, 16, G, GROUP / 2, 2}).permute({0, 3, 4, 1, 2, 5}).reshape({T, G, GROUP / 2, 2, 2, 32});
  auto bytes = e.select(4, 0).bitwise_or(e.select(4, 1).mul(16)).reshape({T, G, CODE_BYTES});  // vectors 2h, 2h + 1
  auto params = [&](const torch::Tensor& p) {
    auto padded = torch::zeros({G, T * TILE_OUT}, p.options().dtype(torch::kHalf));
    padded.narrow(1, 0, N).copy_(p);
    return padded.view({G, T, TILE_OUT}).permute({1, 0, 2}).contiguous().view(torch::kUInt8);  // [T, G, 128]
  };
  return torch::cat(std::vector<torch::Tensor>{bytes, params(scale), params(low)}, 2).contiguous();
}

namespace {

// row_linear_int4's operands: x [M, K] bf16 on the CPU, packed from pack_int4 for K and N outputs.
inline void check_int4_operands(const torch::Tensor& x, const torch::Tensor& packed, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kBFloat16 && x.device().is_cpu(),
              "row_linear_int4 takes bf16 inputs [M, K] on the CPU");
  TORCH_CHECK(x.size(1) % GROUP == 0 && packed.dim() == 3 && packed.scalar_type() == torch::kUInt8 &&
                  packed.size(1) == x.size(1) / GROUP && packed.size(2) == BLOCK && packed.size(0) * TILE_OUT >= N &&
                  packed.is_contiguous(),
              "row_linear_int4: weights not from pack_int4 for this input size");
}

// Per row of x [M, K] (bf16, contiguous) and group of 32 inputs, the sum of its inputs in order (fp32).
std::vector<float> group_sums(const torch::Tensor& x) {
  const int64_t M = x.size(0), G = x.size(1) / GROUP;
  auto values = x.view({M, G, GROUP}).to(torch::kFloat);
  std::vector<float> sums(M * G);
  const float* vp = values.data_ptr<float>();
  for (int64_t i = 0; i < M * G; ++i) {
    float s = 0.0f;
    for (int64_t j = 0; j < GROUP; ++j) s += vp[i * GROUP + j];
    sums[i] = s;
  }
  return sums;
}

}  // namespace

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

namespace {

constexpr int64_t PREFETCH = 2 * BLOCK;  // bytes ahead of the code stream

// R rows against V vectors of 16 outputs (V = 4: the whole tile; V = 2: half `half`) of one tile.
// xs: per row and group, the sum of the group's inputs.
template <int R, int V>
__attribute__((noinline)) void tile_rows(  // (inlined, GCC may keep accumulators in memory: see int8_linear.cpp)
    const at::BFloat16* x, int64_t K, const uint8_t* tile, int half, const float* xs,
                      int64_t G, int64_t n0, int64_t N, at::BFloat16* y, int64_t ldy) {
  __m512 out[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) out[r][v] = _mm512_setzero_ps();
  const int32_t* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = reinterpret_cast<const int32_t*>(x + r * K);
  const __m512i nibble = _mm512_set1_epi16(0x000F), bias = _mm512_set1_epi16(0x4300);  // bf16 128 + q
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* block = tile + g * BLOCK;
    for (int64_t l = 0; l < BLOCK; l += 64)  // the codes stream from memory: ask for them ahead
      _mm_prefetch(reinterpret_cast<const char*>(block) + PREFETCH + l, _MM_HINT_T0);
    __m512 acc[R][V];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
    for (int64_t p = 0; p < GROUP / 2; ++p) {
      const uint8_t* codes = block + p * 64;
      __m512bh w[V];
      for (int h = 0; h < V / 2; ++h) {
        const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(codes + (V == 4 ? h : half) * 32)));
        w[2 * h] = (__m512bh)_mm512_or_si512(_mm512_and_si512(b, nibble), bias);
        w[2 * h + 1] = (__m512bh)_mm512_or_si512(_mm512_srli_epi16(b, 4), bias);
      }
      const int64_t k = g * (GROUP / 2) + p;
      for (int r = 0; r < R; ++r) {
        const __m512bh xb = (__m512bh)_mm512_set1_epi32(xr[r][k]);
        for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], xb, w[v]);
      }
    }
    const uint16_t* scales = reinterpret_cast<const uint16_t*>(block + CODE_BYTES);
    const uint16_t* lows = scales + TILE_OUT;
    for (int v = 0; v < V; ++v) {
      const int64_t col = (V == 4 ? v : 2 * half + v) * 16;
      const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + col)));
      const __m512 l = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lows + col)));
      const __m512 shift = _mm512_fnmadd_ps(_mm512_set1_ps(128.0f), s, l);  // low - 128 scale
      for (int r = 0; r < R; ++r) {
        out[r][v] = _mm512_fmadd_ps(s, acc[r][v], out[r][v]);
        out[r][v] = _mm512_fmadd_ps(shift, _mm512_set1_ps(xs[r * G + g]), out[r][v]);
      }
    }
  }
  for (int v = 0; v < V; ++v) {
    const int64_t c0 = n0 + (V == 4 ? v : 2 * half + v) * 16;
    if (c0 >= N) break;
    const int64_t width = N - c0 < 16 ? N - c0 : 16;
    const __mmask16 keep = static_cast<__mmask16>((1u << width) - 1);
    for (int r = 0; r < R; ++r)
      _mm256_mask_storeu_epi16(y + r * ldy + c0, keep, (__m256i)_mm512_cvtneps_pbh(out[r][v]));
  }
}

// One row group against a tile: one or two rows against the whole tile, three or four against each half.
template <int R>
inline void rows_against_tile(const at::BFloat16* x, int64_t K, const uint8_t* tile, const float* xs, int64_t G,
                              int64_t n0, int64_t N, at::BFloat16* y) {
  if constexpr (R <= 2) {
    tile_rows<R, 4>(x, K, tile, 0, xs, G, n0, N, y, N);
  } else {
    tile_rows<R, 2>(x, K, tile, 0, xs, G, n0, N, y, N);
    tile_rows<R, 2>(x, K, tile, 1, xs, G, n0, N, y, N);
  }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
// The same products on the tile unit (see amx.h): per tile and group, the group's codes become the
// bf16 numbers 128 + q once, in the unit's layout (the packed codes' vectors are its rows already),
// every pass of up to 16 rows gets a = sum x (128 + q) from the unit, and adds scale a +
// (low - 128 scale) s as above. out: per row of the call, the tile's 64 fp32 sums.
void amx_int4(const at::BFloat16* xp, int64_t M, int64_t K, const uint8_t* wp, int64_t tiles, const float* xs,
              int64_t N, at::BFloat16* yp) {
  const int64_t G = K / GROUP;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    alignas(64) uint16_t weights[GROUP / 2 * TILE_OUT * 2];  // a group's 16 input pairs x 64 outputs
    alignas(64) float sums[AMX_ROWS * TILE_OUT];
    std::vector<float> out(M * TILE_OUT);
    int64_t configured = 0;
    const __m512i nibble = _mm512_set1_epi16(0x000F), bias = _mm512_set1_epi16(0x4300);  // bf16 128 + q
    for (int64_t t = begin; t < end; ++t) {
      std::fill(out.begin(), out.end(), 0.0f);
      for (int64_t g = 0; g < G; ++g) {
        const uint8_t* block = wp + (t * G + g) * BLOCK;
        for (int64_t l = 0; l < BLOCK; l += 64)  // the codes stream from memory: ask for them ahead
          _mm_prefetch(reinterpret_cast<const char*>(block) + PREFETCH + l, _MM_HINT_T0);
        for (int64_t p = 0; p < GROUP / 2; ++p)
          for (int h = 0; h < 2; ++h) {
            const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + p * 64 + h * 32)));
            _mm512_store_si512(weights + p * 128 + 2 * h * 32, _mm512_or_si512(_mm512_and_si512(b, nibble), bias));
            _mm512_store_si512(weights + p * 128 + (2 * h + 1) * 32, _mm512_or_si512(_mm512_srli_epi16(b, 4), bias));
          }
        const uint16_t* scales = reinterpret_cast<const uint16_t*>(block + CODE_BYTES);
        const uint16_t* lows = scales + TILE_OUT;
        __m512 scale[4], shift[4];
        for (int v = 0; v < 4; ++v) {
          scale[v] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + v * 16)));
          const __m512 low = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lows + v * 16)));
          shift[v] = _mm512_fnmadd_ps(_mm512_set1_ps(128.0f), scale[v], low);  // low - 128 scale
        }
        for (int64_t m0 = 0; m0 < M; m0 += AMX_ROWS) {
          const int64_t rows = M - m0 < AMX_ROWS ? M - m0 : AMX_ROWS;
          if (rows != configured) amx_configure(configured = rows);
          amx_zero();
          amx_block(xp + m0 * K + g * GROUP, K * 2, weights);
          amx_store(sums);
          for (int64_t r = 0; r < rows; ++r) {
            const __m512 s = _mm512_set1_ps(xs[(m0 + r) * G + g]);
            float* o = out.data() + (m0 + r) * TILE_OUT;
            for (int v = 0; v < 4; ++v) {
              const __m512 a = _mm512_fmadd_ps(scale[v], _mm512_load_ps(sums + r * TILE_OUT + v * 16), _mm512_loadu_ps(o + v * 16));
              _mm512_storeu_ps(o + v * 16, _mm512_fmadd_ps(shift[v], s, a));
            }
          }
        }
      }
      for (int64_t c0 = t * TILE_OUT; c0 < (t + 1) * TILE_OUT && c0 < N; c0 += 16) {
        const int64_t width = N - c0 < 16 ? N - c0 : 16;
        const __mmask16 keep = static_cast<__mmask16>((1u << width) - 1);
        for (int64_t r = 0; r < M; ++r)
          _mm256_mask_storeu_epi16(yp + r * N + c0, keep,
                                   (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(out.data() + r * TILE_OUT + c0 - t * TILE_OUT)));
      }
    }
    if (configured) _tile_release();
  });
}
#endif

}  // namespace

// x [M, K] bfloat16; packed from pack_int4 (N outputs). Returns y [M, N] bfloat16.
torch::Tensor row_linear_int4(torch::Tensor x, torch::Tensor packed, int64_t N) {
  check_int4_operands(x, packed, N);
  const int64_t M = x.size(0), K = x.size(1), G = K / GROUP;
  auto xc = x.contiguous();
  const std::vector<float> xs = group_sums(xc);
  auto y = torch::empty({M, N}, x.options());
  const at::BFloat16* xp = xc.data_ptr<at::BFloat16>();
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  at::BFloat16* yp = y.data_ptr<at::BFloat16>();
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if (amx_on()) {
    amx_int4(xp, M, K, wp, packed.size(0), xs.data(), N, yp);
    return y;
  }
#endif
  at::parallel_for(0, packed.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const uint8_t* tile = wp + t * G * BLOCK;
      const int64_t n0 = t * TILE_OUT;
      for_row_groups(M, [&](int64_t m, auto group) {
        rows_against_tile<decltype(group)::value>(xp + m * K, K, tile, xs.data() + m * G, G, n0, N, yp + m * N);
      });
    }
  });
  return y;
}

bool row_linear_int4_available() { return true; }

#elif defined(__AVX2__)  // fp32 lanes (see avx2.h)

namespace {

// R rows (fp32) against V vectors of 8 outputs of a tile, from vector `first` on. Per output and
// group, a = sum x[k] q[k] as one fp32 chain over the group's inputs in order, then out += scale a +
// low s (s: the group's input sum). In the layout a pair's codes of outputs 16 u .. 16 u + 15 are the
// low (u even) or high (u odd) nibbles of 32 bytes, inputs alternating: 16 bytes hold a vector's.
template <int R, int V>
__attribute__((noinline)) void int4_rows(const float* x, int64_t K, const uint8_t* tile, int first, const float* xs,
                                         int64_t G, int64_t n0, int64_t N, at::BFloat16* y, int64_t ldy) {
  alignas(32) float out[R][V][8] = {};
  const __m256i nibble = _mm256_set1_epi16(0x000F), low16 = _mm256_set1_epi32(0x0000FFFF);
  int64_t offset[V];  // of vector v's 16 bytes in a pair's 64
  __m128i shift[V];   // 0 or 4: low or high nibbles
  for (int v = 0; v < V; ++v) {
    const int u = first + v, vector16 = u / 2;  // the layout's 16-output vector, its half u % 2
    offset[v] = (vector16 / 2) * 32 + (u % 2) * 16;
    shift[v] = _mm_cvtsi32_si128(vector16 % 2 ? 4 : 0);
  }
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* block = tile + g * BLOCK;
    for (int64_t l = CODE_BYTES; l < BLOCK; l += 64)  // the codes stream from memory: ask for them ahead
      _mm_prefetch(reinterpret_cast<const char*>(block) + 2 * BLOCK + l, _MM_HINT_T0);
    __m256 acc[R][V];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
    for (int64_t p = 0; p < GROUP / 2; ++p) {
      const uint8_t* codes = block + p * 64;
      _mm_prefetch(reinterpret_cast<const char*>(codes) + 2 * BLOCK, _MM_HINT_T0);
      __m256 even[R], odd[R];
      for (int r = 0; r < R; ++r) {
        even[r] = _mm256_broadcast_ss(x + r * K + g * GROUP + 2 * p);
        odd[r] = _mm256_broadcast_ss(x + r * K + g * GROUP + 2 * p + 1);
      }
      for (int v = 0; v < V; ++v) {
        __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + offset[v])));
        q = _mm256_and_si256(_mm256_srl_epi16(q, shift[v]), nibble);  // lane o: codes (o, 2p), (o, 2p + 1)
        const __m256 we = _mm256_cvtepi32_ps(_mm256_and_si256(q, low16));
        const __m256 wo = _mm256_cvtepi32_ps(_mm256_srli_epi32(q, 16));
        for (int r = 0; r < R; ++r) {
          acc[r][v] = _mm256_fmadd_ps(even[r], we, acc[r][v]);
          acc[r][v] = _mm256_fmadd_ps(odd[r], wo, acc[r][v]);
        }
      }
    }
    const uint16_t* scales = reinterpret_cast<const uint16_t*>(block + CODE_BYTES);
    const uint16_t* lows = scales + TILE_OUT;
    for (int v = 0; v < V; ++v) {
      const int u = first + v;
      const __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + u * 8)));
      const __m256 low = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lows + u * 8)));
      for (int r = 0; r < R; ++r) {
        const __m256 o = _mm256_fmadd_ps(scale, acc[r][v], _mm256_load_ps(out[r][v]));
        _mm256_store_ps(out[r][v], _mm256_fmadd_ps(low, _mm256_set1_ps(xs[r * G + g]), o));
      }
    }
  }
  for (int v = 0; v < V; ++v) {
    const int64_t c0 = n0 + (first + v) * 8;
    if (c0 >= N) break;
    for (int r = 0; r < R; ++r) store_bf16(y + r * ldy + c0, _mm256_load_ps(out[r][v]), N - c0 < 8 ? N - c0 : 8);
  }
}

}  // namespace

torch::Tensor row_linear_int4(torch::Tensor x, torch::Tensor packed, int64_t N) {
  check_int4_operands(x, packed, N);
  const int64_t M = x.size(0), K = x.size(1), G = K / GROUP;
  auto xc = x.contiguous();
  const std::vector<float> xs = group_sums(xc);
  auto xf = xc.to(torch::kFloat).contiguous();  // exact
  auto y = torch::empty({M, N}, x.options());
  const float* xp = xf.data_ptr<float>();
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  at::BFloat16* yp = y.data_ptr<at::BFloat16>();
  avx2_passes(M, packed.size(0), [&](int64_t t, int64_t m, int first, auto rows, auto vectors) {
    int4_rows<decltype(rows)::value, decltype(vectors)::value>(xp + m * K, K, wp + t * G * BLOCK, first,
                                                               xs.data() + m * G, G, t * TILE_OUT, N, yp + m * N, N);
  });
  return y;
}

bool row_linear_int4_available() { return true; }

#else  // no AVX2: int4 linears run torch's kernel (quantize.py asks first)

torch::Tensor row_linear_int4(torch::Tensor x, torch::Tensor packed, int64_t N) {
  TORCH_CHECK(false, "row_linear_int4 was built without AVX2");
}

bool row_linear_int4_available() { return false; }

#endif
