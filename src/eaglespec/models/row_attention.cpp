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
#include <vector>

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
  if (q.scalar_type() == torch::kFloat) {
    attend<float>(q, k, v, m, out, scale);
  } else if (q.scalar_type() == torch::kBFloat16) {
    attend<at::BFloat16>(q, k, v, m, out, scale);
  } else {
    TORCH_CHECK(false, "row_attention runs float32 and bfloat16");
  }
  return out;
}
