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
// On CPUs with AVX2 alone the products are integer: each row's inputs become 8-bit codes per group of
// 32 (scale max |x| / 127, as llama.cpp's CPU kernels quantize activations), vpmaddubsw multiplies
// them with the 4-bit codes, and a group adds d a + low s (a the integer sum, d the product of the two
// scales). Fewer operations a weight than fp32 products, which need every code converted to a float:
// on a first-generation Zen the layers' int4 products of one row took 24.5 ms that way and 5-6 ms
// this way (ad hoc), and int4 decodes faster than bf16 there. The rounding of the inputs is each row's
// own, so this path is row-invariant too; its outputs differ from the AVX-512 path's by that rounding.
//
// Layout (`pack_int4`): for each tile of 64 outputs and each group of 32 inputs, 1280 bytes: the
// codes of the group's 16 input pairs (64 bytes a pair: two halves of 32 bytes; in half h, byte j's
// low nibble is element j of vector 2h and its high nibble element j of vector 2h + 1, where element
// j of vector v is output 16 v + j / 2 at input 2 p + j % 2), then the 64 scales and the 64 lows (fp16).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
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

}  // namespace

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

namespace {

constexpr int64_t PREFETCH = 2 * BLOCK;  // bytes ahead of the code stream

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

std::string row_linear_int4_inputs() { return "bf16"; }

#elif defined(__AVX2__)  // 8-bit activations and integer products (see avx2.h)

namespace {

// R rows against V vectors of 16 outputs of a tile, from vector `first` on. Per output and group,
// the integer sum a = sum c[k] q[k] of the row's 8-bit codes c times the weight codes q (vpmaddubsw:
// two products a 16-bit lane, exact, then 16-bit sums over 8 input pairs, at most 8 x 2 x 15 x 127 =
// 30480: no overflow; the two halves of the group added as 32-bit numbers), then out += (scale d) a
// + low s, d the row's group scale and s = d sum c its sum of rounded inputs. In the layout a pair's
// codes of outputs 16 u .. 16 u + 15 are the low (u even) or high (u odd) nibbles of 32 bytes,
// inputs alternating: the byte pairs vpmaddubsw multiplies with the row's two codes.
template <int R, int V>
__attribute__((noinline)) void int4_rows(const int8_t* codes_x, const float* scale_x, const float* sum_x, int64_t K,
                                         const uint8_t* tile, int first, int64_t G, int64_t n0, int64_t N,
                                         at::BFloat16* y, int64_t ldy) {
  // per row and vector, the outputs in the order the 32-bit sums come in: 0-3, 8-11, then 4-7, 12-15
  alignas(32) float out[R][V][16] = {};
  const __m256i nibble = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* block = tile + g * BLOCK;
    for (int64_t l = CODE_BYTES; l < BLOCK; l += 64)  // the codes stream from memory: ask for them ahead
      _mm_prefetch(reinterpret_cast<const char*>(block) + 2 * BLOCK + l, _MM_HINT_T0);
    __m256i sums[2][R][V];  // the 16-bit sums over input pairs 0-7 and 8-15
    for (int half = 0; half < 2; ++half) {
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) sums[half][r][v] = _mm256_setzero_si256();
      for (int64_t p = 8 * half; p < 8 * half + 8; ++p) {
        const uint8_t* codes = block + p * 64;
        _mm_prefetch(reinterpret_cast<const char*>(codes) + 2 * BLOCK, _MM_HINT_T0);
        __m256i w[V];
        for (int v = 0; v < V; ++v) {
          const int u = first + v;
          const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + (u / 2) * 32));
          w[v] = _mm256_and_si256(u % 2 ? _mm256_srli_epi16(b, 4) : b, nibble);
        }
        for (int r = 0; r < R; ++r) {
          int16_t pair;
          std::memcpy(&pair, codes_x + r * K + g * GROUP + 2 * p, 2);
          const __m256i xb = _mm256_set1_epi16(pair);
          for (int v = 0; v < V; ++v) sums[half][r][v] = _mm256_add_epi16(sums[half][r][v], _mm256_maddubs_epi16(w[v], xb));
        }
      }
    }
    const uint16_t* scales = reinterpret_cast<const uint16_t*>(block + CODE_BYTES);
    const uint16_t* lows = scales + TILE_OUT;
    for (int v = 0; v < V; ++v) {
      const int u = first + v;
      const __m256 s0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 16 * u)));
      const __m256 s1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 16 * u + 8)));
      const __m256 l0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lows + 16 * u)));
      const __m256 l1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lows + 16 * u + 8)));
      const __m256 scale[2] = {_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31)};
      const __m256 low[2] = {_mm256_permute2f128_ps(l0, l1, 0x20), _mm256_permute2f128_ps(l0, l1, 0x31)};
      for (int r = 0; r < R; ++r) {
        const __m256i a[2] = {  // outputs 0-3, 8-11 and 4-7, 12-15: pairs 0-7 plus pairs 8-15
            _mm256_madd_epi16(_mm256_unpacklo_epi16(sums[0][r][v], sums[1][r][v]), ones),
            _mm256_madd_epi16(_mm256_unpackhi_epi16(sums[0][r][v], sums[1][r][v]), ones)};
        const __m256 d = _mm256_set1_ps(scale_x[r * G + g]), s = _mm256_set1_ps(sum_x[r * G + g]);
        for (int i = 0; i < 2; ++i) {
          const __m256 o = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[i]), _mm256_mul_ps(scale[i], d), _mm256_load_ps(out[r][v] + 8 * i));
          _mm256_store_ps(out[r][v] + 8 * i, _mm256_fmadd_ps(low[i], s, o));
        }
      }
    }
  }
  for (int v = 0; v < V; ++v) {
    const int64_t c0 = n0 + (first + v) * 16;
    if (c0 >= N) break;
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_load_ps(out[r][v]), b = _mm256_load_ps(out[r][v] + 8);
      store_bf16(y + r * ldy + c0, _mm256_permute2f128_ps(a, b, 0x20), N - c0 < 8 ? N - c0 : 8);
      if (c0 + 8 < N) store_bf16(y + r * ldy + c0 + 8, _mm256_permute2f128_ps(a, b, 0x31), N - c0 - 8 < 8 ? N - c0 - 8 : 8);
    }
  }
}

}  // namespace

torch::Tensor row_linear_int4(torch::Tensor x, torch::Tensor packed, int64_t N) {
  check_int4_operands(x, packed, N);
  const int64_t M = x.size(0), K = x.size(1), G = K / GROUP;
  auto xc = x.contiguous();
  const Int8Rows xq(xc.data_ptr<at::BFloat16>(), M, K);
  auto y = torch::empty({M, N}, x.options());
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  at::BFloat16* yp = y.data_ptr<at::BFloat16>();
  avx2_passes<Int16Vectors>(M, packed.size(0), [&](int64_t t, int64_t m, int first, auto rows, auto vectors) {
    int4_rows<decltype(rows)::value, decltype(vectors)::value>(xq.codes.data() + m * K, xq.scale.data() + m * G,
                                                               xq.sum.data() + m * G, K, wp + t * G * BLOCK, first, G,
                                                               t * TILE_OUT, N, yp + m * N, N);
  });
  return y;
}

bool row_linear_int4_available() { return true; }

std::string row_linear_int4_inputs() { return "int8"; }

#else  // no AVX2: int4 linears run torch's kernel (quantize.py asks first)

torch::Tensor row_linear_int4(torch::Tensor x, torch::Tensor packed, int64_t N) {
  TORCH_CHECK(false, "row_linear_int4 was built without AVX2");
}

bool row_linear_int4_available() { return false; }

std::string row_linear_int4_inputs() { return "none"; }

#endif
