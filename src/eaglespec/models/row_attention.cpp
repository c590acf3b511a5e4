// Attention for decoding and verification on CPUs, one query row at a time.
//
// out[b, h, r] = sum_j softmax_j(scale * q[b, h, r] . k[b, h, j]) v[b, h, j] over the keys j the
// row sees, visited in slot order, in fp32. A row's numbers depend only on its query and the keys
// it sees, in their order: not on how many rows the call carries, nor on masked keys between
// them. So a node verified inside a draft tree (whose ancestors sit in slot order, parents first)
// gets exactly what decoding its path one token at a time gets, in any dtype.
//
// Fixed summation orders: dot products over 8 interleaved partial sums combined in one order,
// then two passes over the visible keys (max, then exponentials and the weighted sum of values).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace {

constexpr int LANES = 8;

template <typename T>
inline float dot(const float* q, const T* k, int64_t D) {
  float lanes[LANES] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t d = 0;
  for (; d + LANES <= D; d += LANES)
    for (int l = 0; l < LANES; ++l) lanes[l] += q[d + l] * static_cast<float>(k[d + l]);
  for (; d < D; ++d) lanes[d % LANES] += q[d] * static_cast<float>(k[d]);
  return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

template <typename T>
void attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask,
            torch::Tensor& out, double scale) {
  const int64_t B = q.size(0), H = q.size(1), M = q.size(2), D = q.size(3), S = k.size(2);
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const bool* mp = mask.defined() ? mask.data_ptr<bool>() : nullptr;
  const int64_t mask_batch = mask.defined() && mask.size(0) > 1 ? mask.stride(0) : 0;
  const auto qs = q.strides(), ks = k.strides(), vs = v.strides(), os = out.strides();
  at::parallel_for(0, B * H * M, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> query(D), acc(D), scores(S);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / (H * M), h = (row / M) % H, r = row % M;
      const T* qrow = qp + b * qs[0] + h * qs[1] + r * qs[2];
      for (int64_t d = 0; d < D; ++d) query[d] = static_cast<float>(qrow[d]) * static_cast<float>(scale);
      const bool* visible = mp ? mp + b * mask_batch + r * S : nullptr;
      const T* kbase = kp + b * ks[0] + h * ks[1];
      const T* vbase = vp + b * vs[0] + h * vs[1];
      float top = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < S; ++j) {
        if (visible && !visible[j]) continue;
        scores[j] = dot(query.data(), kbase + j * ks[2], D);
        top = scores[j] > top ? scores[j] : top;
      }
      float total = 0;
      for (int64_t d = 0; d < D; ++d) acc[d] = 0;
      for (int64_t j = 0; j < S; ++j) {
        if (visible && !visible[j]) continue;
        const float e = std::exp(scores[j] - top);
        total += e;
        const T* vrow = vbase + j * vs[2];
        for (int64_t d = 0; d < D; ++d) acc[d] += e * static_cast<float>(vrow[d]);
      }
      T* orow = op + b * os[0] + h * os[1] + r * os[2];  // a row that sees no key gets zeros
      for (int64_t d = 0; d < D; ++d) orow[d] = static_cast<T>(total > 0 ? acc[d] / total : 0.0f);
    }
  });
}

#ifdef __AVX512F__
// The same contract with AVX-512, for any D: over the row's visible keys in slot order (their
// compacted index i = 0, 1, ...), score_i = q . k_i as one 16-lane fp32 chain over D (masked past D)
// then one lane reduction; e_i = exp(score_i - max) by one fixed polynomial; the normalizer and
// the weighted sum of values accumulated in lanes / accumulator sets chosen by i. Every choice
// depends on i only, so a row's numbers depend on its query and its visible keys alone.

inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const at::BFloat16* p, __mmask16 m) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

// exp(x) for x <= 0 (0 below -87): 2^n * p(r), x = n ln2 + r, |r| <= ln2 / 2, p of degree 6.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
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

// CHUNKS = ceil(D / 16), a compile-time constant so that the query and the accumulators stay in
// registers.
template <typename T, int64_t CHUNKS>
void attend512(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask,
               torch::Tensor& out, double scale) {
  const int64_t B = q.size(0), H = q.size(1), M = q.size(2), D = q.size(3), S = k.size(2);
  constexpr int64_t chunks = CHUNKS;
  // chunk c's lanes inside D (chunks past ceil(D / 16) load zeros and add nothing)
  __mmask16 lane_masks[CHUNKS];
  for (int64_t c = 0; c < CHUNKS; ++c) {
    const int64_t width = D - 16 * c;
    lane_masks[c] = static_cast<__mmask16>(width >= 16 ? 0xFFFF : width > 0 ? (1u << width) - 1 : 0);
  }
  auto lanes = [&](int64_t c) { return lane_masks[c]; };
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const bool* mp = mask.defined() ? mask.data_ptr<bool>() : nullptr;
  const int64_t mask_batch = mask.defined() && mask.size(0) > 1 ? mask.stride(0) : 0;
  const auto qs = q.strides(), ks = k.strides(), vs = v.strides(), os = out.strides();
  at::parallel_for(0, B * H * M, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(S + 16);
    std::vector<int64_t> seen(S);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / (H * M), h = (row / M) % H, r = row % M;
      const T* qrow = qp + b * qs[0] + h * qs[1] + r * qs[2];
      __m512 query[CHUNKS];
      for (int64_t c = 0; c < chunks; ++c)
        query[c] = _mm512_mul_ps(load16(qrow + 16 * c, lanes(c)), _mm512_set1_ps(static_cast<float>(scale)));
      const bool* visible = mp ? mp + b * mask_batch + r * S : nullptr;
      const T* kbase = kp + b * ks[0] + h * ks[1];
      const T* vbase = vp + b * vs[0] + h * vs[1];
      int64_t n = 0;
      for (int64_t j = 0; j < S; ++j)
        if (!visible || visible[j]) seen[n++] = j;
      for (int64_t i = 0; i < n; ++i) {
        const T* key = kbase + seen[i] * ks[2];
        __m512 acc = _mm512_mul_ps(query[0], load16(key, lanes(0)));
        for (int64_t c = 1; c < chunks; ++c) acc = _mm512_fmadd_ps(query[c], load16(key + 16 * c, lanes(c)), acc);
        scores[i] = _mm512_reduce_add_ps(acc);
      }
      __m512 tops = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
        tops = _mm512_mask_max_ps(tops, m, tops, _mm512_maskz_loadu_ps(m, scores.data() + i));
      }
      const float top = _mm512_reduce_max_ps(tops);
      // exponentials in place, and the normalizer: lane i % 16 takes e_i
      __m512 total = _mm512_setzero_ps();
      for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, scores.data() + i), _mm512_set1_ps(top)));
        _mm512_mask_storeu_ps(scores.data() + i, m, e);
        total = _mm512_add_ps(total, _mm512_maskz_mov_ps(m, e));
      }
      const float sum = _mm512_reduce_add_ps(total);
      // the weighted sum of values: key i into accumulator set i % 2, the sets added at the end
      __m512 acc[2][CHUNKS];
      for (int s2 = 0; s2 < 2; ++s2)
        for (int64_t c = 0; c < chunks; ++c) acc[s2][c] = _mm512_setzero_ps();
      for (int64_t i = 0; i < n; ++i) {
        const T* value = vbase + seen[i] * vs[2];
        const __m512 e = _mm512_set1_ps(scores[i]);
        __m512* a = acc[i & 1];
        for (int64_t c = 0; c < chunks; ++c) a[c] = _mm512_fmadd_ps(e, load16(value + 16 * c, lanes(c)), a[c]);
      }
      T* orow = op + b * os[0] + h * os[1] + r * os[2];  // a row that sees no key gets zeros
      const __m512 inv = _mm512_set1_ps(n > 0 ? 1.0f / sum : 0.0f);
      float tmp[16];
      for (int64_t c = 0; c < chunks; ++c) {
        _mm512_storeu_ps(tmp, _mm512_mul_ps(_mm512_add_ps(acc[0][c], acc[1][c]), inv));
        for (int64_t d = 16 * c; d < D && d < 16 * (c + 1); ++d) orow[d] = static_cast<T>(tmp[d - 16 * c]);
      }
    }
  });
}
#endif

}  // namespace

// q [B, H, M, D]; k, v [B, H, S, D] (last dim contiguous; a view of the cache is fine);
// mask: undefined (every key visible) or bool [1 or B, M, S], contiguous.
torch::Tensor row_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, c10::optional<torch::Tensor> mask,
                            double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be [B, H, rows, D]");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "the last dimension must be contiguous");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(), "q, k, v dtypes differ");
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "row_attention runs on CPUs");
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3),
              "k and v must be [B, H, keys, D] with q's B, H and D (fold grouped query heads into rows)");
  torch::Tensor m;
  if (mask.has_value()) {
    m = mask->contiguous();
    TORCH_CHECK(m.scalar_type() == torch::kBool && m.dim() == 3 && (m.size(0) == 1 || m.size(0) == q.size(0)) &&
                    m.size(1) == q.size(2) && m.size(2) == k.size(2),
                "mask must be bool [1 or B, rows, keys]");
  }
  auto out = torch::empty_like(q, torch::MemoryFormat::Contiguous);
#ifdef __AVX512F__
  const int64_t D = q.size(3);
  if (D <= 256 && (q.scalar_type() == torch::kFloat || q.scalar_type() == torch::kBFloat16)) {
    const bool bf16 = q.scalar_type() == torch::kBFloat16;
    auto run = [&](auto chunks) {
      constexpr int64_t C = decltype(chunks)::value;
      if (bf16) attend512<at::BFloat16, C>(q, k, v, m, out, scale);
      else attend512<float, C>(q, k, v, m, out, scale);
    };
    if (D <= 16) run(std::integral_constant<int64_t, 1>());
    else if (D <= 32) run(std::integral_constant<int64_t, 2>());
    else if (D <= 64) run(std::integral_constant<int64_t, 4>());
    else if (D <= 128) run(std::integral_constant<int64_t, 8>());
    else run(std::integral_constant<int64_t, 16>());
    return out;
  }
#endif
  if (q.scalar_type() == torch::kFloat) {
    attend<float>(q, k, v, m, out, scale);
  } else if (q.scalar_type() == torch::kBFloat16) {
    attend<at::BFloat16>(q, k, v, m, out, scale);
  } else {
    TORCH_CHECK(false, "row_attention runs float32 and bfloat16");
  }
  return out;
}
