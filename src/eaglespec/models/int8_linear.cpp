// A linear layer over 8-bit weights for decoding and verification on CPUs with AVX-512 (else AVX2):
// y[M, N] = x[M, K] W[N, K]^T, x bf16, w = q * scale (q in -127..127, one fp32 scale per output), y bf16.
//
// The codes stay 8-bit in memory and become fp32 in registers (exact); each output accumulates
// x[k] q[n, k] for k = 0, 1, 2, ... in order in one fp32 lane (FMA), then is scaled and rounded once.
// So a row's result does not depend on how many rows the call carries, nor on the number of threads.
// A tile of 64 outputs is read once per call for all rows (up to four rows sharing each code vector,
// while the tile sits in cache), so a forward over a draft tree costs little more than over one token.
//
// On CPUs with AVX2 alone the products are integer instead: each row's inputs become 8-bit codes per
// group of 32 (scale max |x| / 127, as llama.cpp's CPU kernels quantize activations; see avx2.h) and
// vpmaddubsw multiplies them with the weight codes, four inputs an output at a time. Fewer operations
// a weight than converting every code to a float; the rounding of the inputs is each row's own, so
// that path is row-invariant too.
//
// Layout (`pack_int8`): for each tile of 64 outputs, per input k, the 64 outputs' codes side by side;
// on the AVX2 path per four inputs k .. k + 3, the 64 outputs' four codes side by side.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "avx2.h"
#include "row_groups.h"

namespace {

constexpr int64_t TILE_OUT = 64;

}  // namespace

// The AVX2 path multiplies integers four inputs at a time: its layout keeps each output's four
// consecutive inputs side by side.
#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)) && defined(__AVX2__)
constexpr bool QUADS = true;
#else
constexpr bool QUADS = false;
#endif

// codes [N, K] int8 -> the kernel's layout [ceil(N / 64), K, 64] int8 (outputs past N get zero codes).
torch::Tensor pack_int8(torch::Tensor codes) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == torch::kChar, "pack_int8: int8 codes [N, K]");
  const int64_t N = codes.size(0), K = codes.size(1), T = (N + TILE_OUT - 1) / TILE_OUT;
  TORCH_CHECK(!QUADS || K % 32 == 0, "pack_int8: K % 32 == 0 on this CPU (inputs rounded in groups of 32)");
  auto padded = torch::zeros({T * TILE_OUT, K}, codes.options());
  padded.narrow(0, 0, N).copy_(codes);
  if (QUADS) return padded.view({T, TILE_OUT, K / 4, 4}).permute({0, 2, 1, 3}).contiguous().view({T, K, TILE_OUT});
  return padded.view({T, TILE_OUT, K}).permute({0, 2, 1}).contiguous();
}

// row_linear_int8's operands: x [M, K] bf16 on the CPU, packed from pack_int8 for K and N outputs,
// fp32 scales [N].
inline void check_int8_operands(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& scale,
                                int64_t N) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kBFloat16 && x.device().is_cpu(),
              "row_linear_int8 takes bf16 inputs [M, K] on the CPU");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == torch::kChar && packed.size(1) == x.size(1) &&
                  packed.size(2) == TILE_OUT && packed.size(0) * TILE_OUT >= N && packed.is_contiguous(),
              "row_linear_int8: weights not from pack_int8 for this input size");
  TORCH_CHECK(scale.scalar_type() == torch::kFloat && scale.numel() == N && scale.is_contiguous(),
              "row_linear_int8: fp32 scales [N]");
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

namespace {

constexpr int64_t PREFETCH = 1024;  // bytes ahead of the code stream

// R rows (x: fp32 copies of the bf16 inputs, exact) against the 64 outputs of one tile. (Not inlined:
// inlined into the caller, GCC kept a single row's accumulators in memory, measured 2x slower.)
template <int R>
__attribute__((noinline)) void tile_rows(const float* x, int64_t K, const int8_t* tile, const float* scale, int64_t n0,
                      int64_t N, at::BFloat16* y, int64_t ldy) {
  __m512 acc[R * 4];  // row r, vector v at r * 4 + v
  for (int i = 0; i < R * 4; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const int8_t* codes = tile + k * TILE_OUT;
    _mm_prefetch(reinterpret_cast<const char*>(codes) + PREFETCH, _MM_HINT_T0);
    __m512 w[4];
    for (int v = 0; v < 4; ++v)
      w[v] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * v))));
    for (int r = 0; r < R; ++r) {
      const __m512 xb = _mm512_set1_ps(x[r * K + k]);
      for (int v = 0; v < 4; ++v) acc[r * 4 + v] = _mm512_fmadd_ps(xb, w[v], acc[r * 4 + v]);
    }
  }
  for (int v = 0; v < 4; ++v) {
    const int64_t c0 = n0 + 16 * v;
    const int64_t width = c0 >= N ? 0 : N - c0 < 16 ? N - c0 : 16;  // (no early exit: acc stays in registers)
    const __mmask16 keep = static_cast<__mmask16>((1u << width) - 1);
    const __m512 s = _mm512_maskz_loadu_ps(keep, scale + c0);
    for (int r = 0; r < R; ++r) {
      // round to bf16 (nearest even) by hand: AVX-512 BF16's conversion is not on every AVX-512 CPU
      const __m512i bits = _mm512_castps_si512(_mm512_mul_ps(acc[r * 4 + v], s));
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
      const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
      _mm256_mask_storeu_epi16(y + r * ldy + c0, keep, _mm512_cvtepi32_epi16(rounded));
    }
  }
}

}  // namespace

// x [M, K] bfloat16; packed from pack_int8 (N outputs); scale [N] fp32. Returns y [M, N] bfloat16.
torch::Tensor row_linear_int8(torch::Tensor x, torch::Tensor packed, torch::Tensor scale, int64_t N) {
  check_int8_operands(x, packed, scale, N);
  const int64_t M = x.size(0), K = x.size(1);
  auto xf = x.to(torch::kFloat).contiguous();
  auto y = torch::empty({M, N}, x.options());
  const float* xp = xf.data_ptr<float>();
  const int8_t* wp = packed.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  at::BFloat16* yp = y.data_ptr<at::BFloat16>();
  at::parallel_for(0, packed.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int8_t* tile = wp + t * K * TILE_OUT;
      const int64_t n0 = t * TILE_OUT;
      for_row_groups(M, [&](int64_t m, auto group) { tile_rows<decltype(group)::value>(xp + m * K, K, tile, sp, n0, N, yp + m * N, N); });
    }
  });
  return y;
}

bool row_linear_int8_available() { return true; }

std::string row_linear_int8_inputs() { return "bf16"; }

#elif defined(__AVX2__)  // 8-bit activations and integer products (see avx2.h)

namespace {

constexpr int64_t PREFETCH = 2048;  // bytes ahead of the code stream

// R rows against V vectors of 8 outputs of a tile, from vector `first` on. Per output and group of
// 32 inputs, the integer sum a = sum c[k] q[k] of the row's 8-bit codes c times the weight codes q
// (vpmaddubsw over |q| and c with q's sign: two products a 16-bit lane, at most 2 x 127 x 127, then
// 32-bit sums of an output's four inputs), then out += d a, d the row's group scale; y = scale out.
template <int R, int V>
__attribute__((noinline)) void int8_rows(const int8_t* codes_x, const float* scale_x, int64_t K, const int8_t* tile,
                                         int first, const float* scale, int64_t n0, int64_t N, at::BFloat16* y,
                                         int64_t ldy) {
  alignas(32) float out[R][V][8] = {};
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t G = K / 32;
  for (int64_t g = 0; g < G; ++g) {
    __m256i acc[R][V];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_si256();
    for (int64_t quad = 8 * g; quad < 8 * g + 8; ++quad) {
      const int8_t* codes = tile + quad * 4 * TILE_OUT + first * 32;
      for (int l = 0; l < V * 32; l += 64) _mm_prefetch(reinterpret_cast<const char*>(codes) + PREFETCH + l, _MM_HINT_T0);
      __m256i xb[R];
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, codes_x + r * K + 4 * quad, 4);
        xb[r] = _mm256_set1_epi32(four);
      }
      for (int v = 0; v < V; ++v) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * v));
        const __m256i magnitude = _mm256_abs_epi8(w);
        for (int r = 0; r < R; ++r)
          acc[r][v] = _mm256_add_epi32(acc[r][v], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(xb[r], w)), ones));
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256 d = _mm256_set1_ps(scale_x[r * G + g]);
      for (int v = 0; v < V; ++v)
        _mm256_store_ps(out[r][v], _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][v]), d, _mm256_load_ps(out[r][v])));
    }
  }
  for (int v = 0; v < V; ++v) {
    const int64_t c0 = n0 + (first + v) * 8;
    if (c0 >= N) break;
    const int64_t width = N - c0 < 8 ? N - c0 : 8;
    alignas(32) float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t i = 0; i < width; ++i) s[i] = scale[c0 + i];
    for (int r = 0; r < R; ++r) store_bf16(y + r * ldy + c0, _mm256_mul_ps(_mm256_load_ps(out[r][v]), _mm256_load_ps(s)), width);
  }
}

}  // namespace

torch::Tensor row_linear_int8(torch::Tensor x, torch::Tensor packed, torch::Tensor scale, int64_t N) {
  check_int8_operands(x, packed, scale, N);
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K % 32 == 0, "row_linear_int8: K % 32 == 0 (its inputs are rounded in groups of 32)");
  auto xc = x.contiguous();
  const Int8Rows xq(xc.data_ptr<at::BFloat16>(), M, K);
  auto y = torch::empty({M, N}, x.options());
  const int8_t* wp = packed.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  at::BFloat16* yp = y.data_ptr<at::BFloat16>();
  avx2_passes<Fp32Vectors>(M, packed.size(0), [&](int64_t t, int64_t m, int first, auto rows, auto vectors) {
    int8_rows<decltype(rows)::value, decltype(vectors)::value>(xq.codes.data() + m * K, xq.scale.data() + m * (K / 32), K,
                                                               wp + t * K * TILE_OUT, first, sp, t * TILE_OUT, N,
                                                               yp + m * N, N);
  });
  return y;
}

bool row_linear_int8_available() { return true; }

std::string row_linear_int8_inputs() { return "int8"; }

#else  // no AVX2: int8 linears run torch's kernel (quantize.py asks first)

torch::Tensor row_linear_int8(torch::Tensor x, torch::Tensor packed, torch::Tensor scale, int64_t N) {
  TORCH_CHECK(false, "row_linear_int8 was built without AVX2");
}

bool row_linear_int8_available() { return false; }

std::string row_linear_int8_inputs() { return "none"; }

#endif
