// A linear layer for decoding and verification on CPUs: y[M, N] = x[M, K] W[N, K]^T (+ b), for the few
// rows (one token, or a draft tree) that decoding forwards carry, over fp32 weights (AVX2) or bf16
// weights (AVX-512 BF16).
//
// Each output is one dot product over K in a fixed order, then the lanes combined in one fixed order,
// the bias added, and the result rounded once to the output dtype:
// - fp32 weights: 8 fp32 lanes, lane l accumulating fma(x[k], w[k], acc) for k = l, l + 8, ... in order;
// - bf16 weights (bf16 inputs): 16 fp32 lanes, lane l accumulating x[k] w[k] + x[k+1] w[k+1] for
//   k = 2l, 2l + 32, ... in order (one vdpbf16ps per 32 inputs), the lanes summed by one reduction.
// So a row's result does not depend on how many rows the call carries (verification gives a tree node
// what one-token decoding gives it), nor on the number of threads (a thread computes whole outputs).
// oneDNN's bf16 products are not like this on every CPU: on AMD Zen 5 their rows change with the row
// count once K >= 1536 (measured), so bf16 verification needs this kernel there.
//
// A thread takes blocks of 8 weight rows and runs every input row against them while they sit in
// its cache: three (fp32) or four (bf16) rows at a time, each weight vector serving them all, the
// rest one at a time.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>

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

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>

namespace {

constexpr int64_t BF_STEP = 32;   // bf16 inputs per vdpbf16ps
constexpr int64_t BF_NB = 8;      // outputs per block

// The 16 lanes of an accumulator summed in one fixed order (the same instructions for every call).
inline float lane_sum16(__m512 a) { return _mm512_reduce_add_ps(a); }

inline __m512bh load_bh(const at::BFloat16* p) { return (__m512bh)_mm512_loadu_si512(p); }

// One row against the BF_NB weight rows wr: sums [BF_NB].
inline void bf_row_block(const at::BFloat16* x, int64_t K, const at::BFloat16* const* wr, float* sums) {
  __m512 a[BF_NB];
  for (int j = 0; j < BF_NB; ++j) a[j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += BF_STEP) {
    const __m512bh v = load_bh(x + k);
    for (int j = 0; j < BF_NB; ++j) a[j] = _mm512_dpbf16_ps(a[j], v, load_bh(wr[j] + k));
  }
  for (int j = 0; j < BF_NB; ++j) sums[j] = lane_sum16(a[j]);
}

// Four rows against 4 weight rows: 16 accumulators. sums [4][BF_NB], at the 4 columns' offsets.
inline void bf_four_rows(const at::BFloat16* x, int64_t K, const at::BFloat16* const* wr, float* sums) {
  __m512 a[4][4];
  for (int r = 0; r < 4; ++r)
    for (int j = 0; j < 4; ++j) a[r][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += BF_STEP) {
    const __m512bh v0 = load_bh(x + k), v1 = load_bh(x + K + k), v2 = load_bh(x + 2 * K + k),
                   v3 = load_bh(x + 3 * K + k);
    for (int j = 0; j < 4; ++j) {
      const __m512bh w = load_bh(wr[j] + k);
      a[0][j] = _mm512_dpbf16_ps(a[0][j], v0, w);
      a[1][j] = _mm512_dpbf16_ps(a[1][j], v1, w);
      a[2][j] = _mm512_dpbf16_ps(a[2][j], v2, w);
      a[3][j] = _mm512_dpbf16_ps(a[3][j], v3, w);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int j = 0; j < 4; ++j) sums[r * BF_NB + j] = lane_sum16(a[r][j]);
}

void bf_run(const at::BFloat16* x, int64_t M, int64_t K, const at::BFloat16* w, int64_t N, const float* bias,
            at::BFloat16* y) {
  const int64_t blocks = (N + BF_NB - 1) / BF_NB;
  at::parallel_for(0, blocks, 8, [&](int64_t begin, int64_t end) {
    float sums[4 * BF_NB];
    auto write = [&](int64_t m, int64_t n0, const float* l) {
      for (int64_t j = 0; j < BF_NB && n0 + j < N; ++j) {
        float v = l[j];
        if (bias) v += bias[n0 + j];
        y[m * N + n0 + j] = static_cast<at::BFloat16>(v);
      }
    };
    for (int64_t b = begin; b < end; ++b) {
      const int64_t n0 = b * BF_NB;
      const at::BFloat16* wr[BF_NB];  // past the last output the block repeats row n0 (its results are dropped)
      for (int64_t j = 0; j < BF_NB; ++j) wr[j] = w + (n0 + j < N ? n0 + j : n0) * K;
      int64_t m = 0;
      for (; m + 4 <= M; m += 4) {
        bf_four_rows(x + m * K, K, wr, sums);
        bf_four_rows(x + m * K, K, wr + 4, sums + 4);
        for (int64_t r = 0; r < 4; ++r) write(m + r, n0, sums + r * BF_NB);
      }
      for (; m < M; ++m) {
        bf_row_block(x + m * K, K, wr, sums);
        write(m, n0, sums);
      }
    }
  });
}

}  // namespace

// x [M, K] and w [N, K] bfloat16, K % 32 == 0; bias [N] or undefined. Returns y [M, N] in bfloat16.
torch::Tensor row_linear_bf16(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [M, K] and w [N, K] expected");
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "row_linear runs on CPUs");
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && w.scalar_type() == torch::kBFloat16,
              "row_linear_bf16 takes bfloat16 inputs and weights");
  TORCH_CHECK(x.size(1) % BF_STEP == 0, "row_linear_bf16 needs K % 32 == 0");
  auto xc = x.contiguous();
  auto wc = w.contiguous();
  torch::Tensor b;
  if (bias.has_value() && bias->defined()) b = bias->to(torch::kFloat).contiguous();
  auto y = torch::empty({x.size(0), w.size(0)}, x.options());
  bf_run(xc.data_ptr<at::BFloat16>(), x.size(0), x.size(1), wc.data_ptr<at::BFloat16>(), w.size(0),
         b.defined() ? b.data_ptr<float>() : nullptr, y.data_ptr<at::BFloat16>());
  return y;
}

bool row_linear_bf16_available() { return true; }

#else  // no AVX-512 BF16: bf16 linears run oneDNN's (kernels.py asks first)

torch::Tensor row_linear_bf16(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(false, "row_linear_bf16 was built without AVX-512 BF16");
}

bool row_linear_bf16_available() { return false; }

#endif
