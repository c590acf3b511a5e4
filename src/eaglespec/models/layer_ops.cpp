// The small operations of a decoder layer, each fused into one call for decoding and verification
// on CPUs. In eager torch they are about 60 operator calls per layer (RMSNorm alone is eight), and
// at one token per forward their dispatch costs more than their arithmetic.
//
// Each works row by row in fp32, so a row's result depends only on that row (as verification needs):
// not on how many rows the call carries, nor on the threads. In bf16 they round where the eager
// operators (and transformers' modules) round, after each elementwise step, so the numbers are theirs
// up to the order of RMSNorm's sum of squares.
//
//   rms_norm(x, w, eps)        w * (x / sqrt(mean(x^2) + eps))
//   gated(gate_up, gelu)       act(gate) * up, gate and up the two halves of the last axis, act SiLU or
//                              (gelu) GELU's tanh form
//   rope_store(qkv, cos, sin, k_cache, v_cache, start, heads, kv_heads, q_norm, k_norm, eps)
//                              splits the fused q/k/v projection [B, T, (heads + 2 kv_heads) D],
//                              normalizes each head of q and k by its RMSNorm where given (Qwen3,
//                              Gemma-3), rotates their first R dimensions (rotary embedding, half-split
//                              convention; R the tables' width), writes k and v to the cache slots
//                              start..start+T-1 ([B, kv_heads, capacity, D]) and returns q as [B, heads, T, D]

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#endif

namespace {

// v rounded to T and back: where an eager operator would store its result in T.
template <typename T>
inline float in(float v) {
  return static_cast<float>(static_cast<T>(v));
}

template <typename T>
void rms_norm_rows(const T* x, const T* w, T* out, int64_t rows, int64_t H, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * H;
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t i = 0; i < H; ++i) {
      const float v = static_cast<float>(xr[i]);
      lanes[i % 8] += v * v;
    }
    const float ss = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(H) + eps);
    for (int64_t i = 0; i < H; ++i)
      out[r * H + i] = static_cast<T>(static_cast<float>(w[i]) * in<T>(static_cast<float>(xr[i]) * inv));
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// 16 values as fp32, and back rounded to T (bf16: to nearest even, as c10's conversion does for
// numbers); `keep` masks a row's last partial vector.
inline __m512 load16(const float* p, __mmask16 keep) { return _mm512_maskz_loadu_ps(keep, p); }
inline __m512 load16(const at::BFloat16* p, __mmask16 keep) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(keep, p)), 16));
}
inline __m512 round_bf16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i up = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  return _mm512_castsi512_ps(_mm512_and_si512(up, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}
inline __m512 in16(__m512 v, const float*) { return v; }
inline __m512 in16(__m512 v, const at::BFloat16*) { return round_bf16(v); }
inline void store16(float* p, __m512 v, __mmask16 keep) { _mm512_mask_storeu_ps(p, keep, v); }
inline void store16(at::BFloat16* p, __m512 v, __mmask16 keep) {
  _mm256_mask_storeu_epi16(p, keep, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(round_bf16(v)), 16)));
}

// e^x in fp32 (Cephes' expf: x = k ln2 + r with |r| <= ln2 / 2, a polynomial in r, times 2^k;
// within about 2 units in the last place), the same in every lane, so a value's result does not
// depend on where it sits.
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-103.9f)), _mm512_set1_ps(88.37626f));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  return _mm512_scalef_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f))), k);
}

// silu(g) = g / (1 + e^-g); GELU's tanh form 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), with
// tanh(y) = 1 - 2 / (e^2y + 1)
inline __m512 silu16(__m512 g) {
  return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
}
inline __m512 gelu16(__m512 g) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 inner = _mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f),
                                     _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), g), _mm512_mul_ps(g, g), g));
  const __m512 e = exp16(_mm512_add_ps(inner, inner));
  const __m512 tanh = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
  return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), g), _mm512_add_ps(one, tanh));
}

template <typename T>
void gated_rows(const T* x, T* out, int64_t rows, int64_t I, bool gelu) {
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / I), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* gate = x + r * 2 * I;
      const T* up = gate + I;
      for (int64_t i = 0; i < I; i += 16) {
        const __mmask16 keep = static_cast<__mmask16>(I - i >= 16 ? 0xffff : (1u << (I - i)) - 1);
        const __m512 g = load16(gate + i, keep);
        const __m512 act = gelu ? gelu16(g) : silu16(g);
        store16(out + r * I + i, _mm512_mul_ps(in16(act, gate), load16(up + i, keep)), keep);
      }
    }
  });
}
#else
template <typename T>
void gated_rows(const T* x, T* out, int64_t rows, int64_t I, bool gelu) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = x + r * 2 * I;
    const T* up = gate + I;
    for (int64_t i = 0; i < I; ++i) {
      const float g = static_cast<float>(gate[i]);
      const float act = gelu ? 0.5f * g * (1.0f + std::tanh(0.7978845608028654f * (g + 0.044715f * g * g * g)))
                             : g / (1.0f + std::exp(-g));
      out[r * I + i] = static_cast<T>(in<T>(act) * static_cast<float>(up[i]));
    }
  }
}
#endif

// dst[0..D) = src rotated by (cos, sin) over its first R dimensions: x * cos + rotate_half(x) * sin;
// the rest copied.
template <typename T>
inline void rotate(const T* src, const T* cos, const T* sin, T* dst, int64_t D, int64_t R) {
  const int64_t half = R / 2;
  for (int64_t d = R; d < D; ++d) dst[d] = src[d];
  for (int64_t d = 0; d < R; ++d) {
    const float other = d < half ? -static_cast<float>(src[d + half]) : static_cast<float>(src[d - half]);
    dst[d] = static_cast<T>(in<T>(static_cast<float>(src[d]) * static_cast<float>(cos[d])) +
                            in<T>(other * static_cast<float>(sin[d])));
  }
}

template <typename T>
void rope_store_rows(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin,
                     torch::Tensor& k_cache, torch::Tensor& v_cache, torch::Tensor& q, int64_t start,
                     int64_t heads, int64_t kv_heads, const T* q_norm, const T* k_norm, float eps) {
  const int64_t B = qkv.size(0), T_ = qkv.size(1), D = q.size(3), R = cos.size(2);
  std::vector<T> normed(D);
  // a head's vector, normalized first where it has a norm (as RMSNorm over the head: rms_norm_rows)
  auto head = [&](const T* src, const T* w) -> const T* {
    if (w == nullptr) return src;
    rms_norm_rows(src, w, normed.data(), 1, D, eps);
    return normed.data();
  };
  const T* src = qkv.data_ptr<T>();
  const T* cp = cos.data_ptr<T>();
  const T* sp = sin.data_ptr<T>();
  T* qp = q.data_ptr<T>();
  T* kp = k_cache.data_ptr<T>();
  T* vp = v_cache.data_ptr<T>();
  const auto ks = k_cache.strides(), vs = v_cache.strides();
  const int64_t width = (heads + 2 * kv_heads) * D;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T_; ++t) {
      const T* row = src + (b * T_ + t) * width;
      const T* c = cp + (b * T_ + t) * R;
      const T* s = sp + (b * T_ + t) * R;
      for (int64_t h = 0; h < heads; ++h)
        rotate(head(row + h * D, q_norm), c, s, qp + ((b * heads + h) * T_ + t) * D, D, R);
      for (int64_t h = 0; h < kv_heads; ++h) {
        rotate(head(row + (heads + h) * D, k_norm), c, s, kp + b * ks[0] + h * ks[1] + (start + t) * ks[2], D, R);
        const T* v = row + (heads + kv_heads + h) * D;
        T* vd = vp + b * vs[0] + h * vs[1] + (start + t) * vs[2];
        for (int64_t d = 0; d < D; ++d) vd[d] = v[d];
      }
    }
  }
}

void check_cpu_dtype(const torch::Tensor& x, const char* what) {
  TORCH_CHECK(x.device().is_cpu(), what, ": CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, what, ": fp32 or bf16 only");
}

}  // namespace

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  check_cpu_dtype(x, "rms_norm");
  TORCH_CHECK(w.scalar_type() == x.scalar_type() && w.dim() == 1 && w.size(0) == x.size(-1), "rms_norm: weight");
  x = x.contiguous();
  w = w.contiguous();
  auto out = torch::empty_like(x);
  const int64_t H = x.size(-1), rows = x.numel() / H;
  AT_DISPATCH_SWITCH(x.scalar_type(), "rms_norm",
      AT_DISPATCH_CASE(at::kFloat, [&] { rms_norm_rows(x.data_ptr<float>(), w.data_ptr<float>(), out.data_ptr<float>(), rows, H, eps); })
      AT_DISPATCH_CASE(at::kBFloat16, [&] { rms_norm_rows(x.data_ptr<at::BFloat16>(), w.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>(), rows, H, eps); }));
  return out;
}

torch::Tensor gated(torch::Tensor x, bool gelu) {
  check_cpu_dtype(x, "gated");
  x = x.contiguous();
  const int64_t I = x.size(-1) / 2, rows = x.numel() / x.size(-1);
  auto shape = x.sizes().vec();
  shape.back() = I;
  auto out = torch::empty(shape, x.options());
  AT_DISPATCH_SWITCH(x.scalar_type(), "gated",
      AT_DISPATCH_CASE(at::kFloat, [&] { gated_rows(x.data_ptr<float>(), out.data_ptr<float>(), rows, I, gelu); })
      AT_DISPATCH_CASE(at::kBFloat16, [&] { gated_rows(x.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>(), rows, I, gelu); }));
  return out;
}

torch::Tensor rope_store(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor k_cache,
                         torch::Tensor v_cache, int64_t start, int64_t heads, int64_t kv_heads,
                         c10::optional<torch::Tensor> q_norm, c10::optional<torch::Tensor> k_norm, double eps) {
  check_cpu_dtype(qkv, "rope_store");
  const auto dtype = qkv.scalar_type();
  TORCH_CHECK(cos.scalar_type() == dtype && sin.scalar_type() == dtype && k_cache.scalar_type() == dtype &&
              v_cache.scalar_type() == dtype, "rope_store: one dtype for q/k/v, rotary tables and cache");
  const int64_t B = qkv.size(0), T_ = qkv.size(1), D = k_cache.size(3);
  TORCH_CHECK(qkv.size(2) == (heads + 2 * kv_heads) * D && k_cache.size(1) == kv_heads &&
              start + T_ <= k_cache.size(2) && k_cache.stride(3) == 1 && v_cache.stride(3) == 1, "rope_store: shapes");
  const int64_t R = cos.size(-1);
  TORCH_CHECK(R <= D && R % 2 == 0 && sin.size(-1) == R, "rope_store: rotary tables");
  TORCH_CHECK(q_norm.has_value() == k_norm.has_value(), "rope_store: q and k norms go together");
  if (q_norm.has_value()) {
    TORCH_CHECK(q_norm->scalar_type() == dtype && k_norm->scalar_type() == dtype && q_norm->numel() == D &&
                k_norm->numel() == D, "rope_store: q/k norms of the head's size and dtype");
    q_norm = q_norm->contiguous();
    k_norm = k_norm->contiguous();
  }
  qkv = qkv.contiguous();
  cos = cos.reshape({B, T_, R}).contiguous();
  sin = sin.reshape({B, T_, R}).contiguous();
  auto q = torch::empty({B, heads, T_, D}, qkv.options());
  AT_DISPATCH_SWITCH(dtype, "rope_store",
      AT_DISPATCH_CASE(at::kFloat, [&] {
        rope_store_rows<float>(qkv, cos, sin, k_cache, v_cache, q, start, heads, kv_heads,
                               q_norm ? q_norm->data_ptr<float>() : nullptr, k_norm ? k_norm->data_ptr<float>() : nullptr, eps);
      })
      AT_DISPATCH_CASE(at::kBFloat16, [&] {
        rope_store_rows<at::BFloat16>(qkv, cos, sin, k_cache, v_cache, q, start, heads, kv_heads,
                                      q_norm ? q_norm->data_ptr<at::BFloat16>() : nullptr,
                                      k_norm ? k_norm->data_ptr<at::BFloat16>() : nullptr, eps);
      }));
  return q;
}
