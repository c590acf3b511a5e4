// The target's decoder layers for inference on CPUs, run in one call: the same operations, in the
// same order and with the same kernels as the Python layers (`Layer`, `Attention`, `MLP` in
// decoder.py), without a Python call per operation. At one token per forward, a layer's Python
// dispatch (about 20 operator and module calls) costs more than its arithmetic; this loop keeps
// the arithmetic and drops the dispatch. Its result equals the Python layers' bit for bit (tested).
//
// A LayerStack is built once per model (`Stack.layer_stack`: the target's layers, or an EAGLE-1
// head's, whose layer has no input norm) from each layer's weights: six norm weights (input, the
// MLP's input, the query's and key's, the attention's and the MLP's outputs; all but the second may
// be none), two flags (whether the sliding window limits the layer, whether it takes the local
// RoPE tables), two attention linears and its MLP's: gate_up and down, or a mixture of experts'
// router, each expert's gate_up and down and a shared expert's gate_up, down and gate (the
// operations of decoder.Experts, in its order); each linear one of
//   TILES  bf16 weights packed for row_linear_bf16 (AVX-512 BF16)
//   FP32   fp32 weights: row_linear up to 128 rows, else MKL with rows padded to a multiple of 4
//   INT4   row_linear_int4 (weights from pack_int4: 3-d), else torch's _weight_int4pack_mm_for_cpu,
//          over bf16 activations
//   INT8   row_linear_int8 (weights from pack_int8: 3-d), else torch's _weight_int8pack_mm, over bf16
//          activations
// (bf16 weights packed for oneDNN, on CPUs without AVX-512 BF16, keep the Python layers).

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <vector>

torch::Tensor row_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, c10::optional<torch::Tensor> mask,
                            double scale);
torch::Tensor row_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias);
bool row_linear_available();
torch::Tensor row_linear_bf16(torch::Tensor x, torch::Tensor packed, int64_t N, c10::optional<torch::Tensor> bias);
torch::Tensor row_linear_int4(torch::Tensor x, torch::Tensor packed, int64_t N);
torch::Tensor row_linear_int8(torch::Tensor x, torch::Tensor packed, torch::Tensor scale, int64_t N);
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps);
torch::Tensor gated(torch::Tensor x, bool gelu);
torch::Tensor rope_store(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor k_cache,
                         torch::Tensor v_cache, int64_t start, int64_t heads, int64_t kv_heads,
                         c10::optional<torch::Tensor> q_norm, c10::optional<torch::Tensor> k_norm, double eps);

namespace {

enum Kind : int64_t { TILES = 0, FP32 = 1, INT4 = 2, INT8 = 3 };
constexpr int64_t KERNEL_ROWS = 128;  // as in decoder.py
constexpr int64_t ROW_ALIGN = 4;
constexpr int64_t INT4_GROUP = 32;    // as in quantize.py

struct LinearSpec {
  int64_t kind;
  torch::Tensor weight;  // TILES: packed; FP32: [N, K]; INT4 / INT8: the packed codes
  torch::Tensor scales;  // INT4: torch's scale_offset (ours: undefined); INT8: per-row scales; else undefined
  c10::optional<torch::Tensor> bias;
  int64_t out_features;

  // x [B, T, K] in the model's dtype -> [B, T, N]
  torch::Tensor operator()(const torch::Tensor& x) const {
    const auto B = x.size(0), T = x.size(1);
    auto rows = x.reshape({B * T, x.size(2)});
    const int64_t M = rows.size(0);
    torch::Tensor y;
    switch (kind) {
      case TILES:
        y = row_linear_bf16(rows, weight, out_features, bias);
        break;
      case FP32:
        if (M <= KERNEL_ROWS && rows.size(1) % 8 == 0 && row_linear_available()) {
          y = row_linear(rows, weight, bias);
        } else if (rows.scalar_type() == at::kFloat && M % ROW_ALIGN) {
          const int64_t padded = (M + ROW_ALIGN - 1) / ROW_ALIGN * ROW_ALIGN;
          y = at::linear(at::constant_pad_nd(rows, {0, 0, 0, padded - M}), weight, bias).narrow(0, 0, M);
        } else {
          return at::linear(x, weight, bias);  // as Linear.forward: the 3-d call
        }
        break;
      case INT4:
      case INT8: {
        auto in = rows.to(at::kBFloat16).contiguous();
        const bool ours = weight.dim() == 3;  // our kernels' layouts
        y = (kind == INT4 ? (ours ? row_linear_int4(in, weight, out_features)
                                  : at::_weight_int4pack_mm_for_cpu(in, weight, INT4_GROUP, scales))
                          : (ours ? row_linear_int8(in, weight, scales, out_features)
                                  : at::_weight_int8pack_mm(in, weight, scales)))
                .to(x.scalar_type());
        if (bias.has_value()) y = y + *bias;
        break;
      }
      default:
        TORCH_CHECK(false, "LayerStack: unknown linear kind");
    }
    return y.view({B, T, out_features});
  }
};

struct LayerWeights {
  c10::optional<torch::Tensor> input_norm;  // none: the layer reads its input as it is (an EAGLE-1 head's)
  torch::Tensor post_attn_norm;
  c10::optional<torch::Tensor> q_norm, k_norm, attn_out_norm, mlp_out_norm;  // where the family has them
  bool windowed, local_rope;
  LinearSpec qkv, o;
  std::vector<LinearSpec> mlp;  // gate_up, down; or router, (gate_up, down) per expert[, shared gate_up, down, gate]
};

using Norms = std::vector<c10::optional<torch::Tensor>>;
using Linears = std::vector<std::tuple<int64_t, torch::Tensor, c10::optional<torch::Tensor>, c10::optional<torch::Tensor>, int64_t>>;

class LayerStack {
 public:
  // norms: 6 per layer (input, post-attention, q, k, attention output, MLP output; None where absent);
  // flags: 2 per layer (windowed, local RoPE); attention: 2 linears per layer (qkv, o); mlps: per
  // layer its MLP's linears (see LayerWeights); each linear (kind, weight, scales or None, bias or
  // None, out_features); scale: the attention's; gelu: GeGLU; experts, top_k, normalize: the
  // mixture of experts' (where a layer has one)
  LayerStack(Norms norms, std::vector<bool> flags, Linears attention, std::vector<Linears> mlps, int64_t heads,
             int64_t kv_heads, double eps, double scale, bool gelu, int64_t experts, int64_t top_k, bool normalize)
      : heads_(heads), kv_heads_(kv_heads), eps_(eps), scale_(scale), gelu_(gelu), experts_(experts), top_k_(top_k),
        normalize_(normalize) {
    const size_t L = mlps.size();
    TORCH_CHECK(attention.size() == 2 * L && norms.size() == 6 * L && flags.size() == 2 * L,
                "LayerStack: 6 norms, 2 flags, 2 attention linears and an MLP a layer");
    auto spec = [](const auto& t) {
      const auto& [kind, weight, scales, bias, out] = t;
      return LinearSpec{kind, weight, scales.has_value() ? *scales : torch::Tensor(), bias, out};
    };
    for (size_t i = 0; i < L; ++i) {
      const auto* n = &norms[6 * i];
      std::vector<LinearSpec> mlp;
      for (const auto& t : mlps[i]) mlp.push_back(spec(t));
      const size_t size = mlp.size();
      TORCH_CHECK(size == 2 || size == 1 + 2 * static_cast<size_t>(experts) ||
                  size == 4 + 2 * static_cast<size_t>(experts), "LayerStack: an MLP's linears");
      layers_.push_back({n[0], *n[1], n[2], n[3], n[4], n[5], flags[2 * i], flags[2 * i + 1], spec(attention[2 * i]),
                         spec(attention[2 * i + 1]), std::move(mlp)});
    }
  }

  // x [B, T, H]; cos, sin [B, 1, T, R] (and the local RoPE's, where a layer takes it); k, v [L, B,
  // kv_heads, capacity, D]; mask (and the windowed layers') undefined or bool [rows, T * groups, S]
  // (grouped as in Stack.run_layers). Returns the output, then the hidden states entering the layers
  // listed in `capture` (index L: the output), in index order.
  std::vector<torch::Tensor> run(torch::Tensor x, torch::Tensor cos, torch::Tensor sin,
                                 c10::optional<torch::Tensor> cos_local, c10::optional<torch::Tensor> sin_local,
                                 torch::Tensor k, torch::Tensor v, int64_t start, c10::optional<torch::Tensor> mask,
                                 c10::optional<torch::Tensor> mask_windowed, std::vector<int64_t> capture) const {
    const int64_t B = x.size(0), T = x.size(1), end = start + T, L = static_cast<int64_t>(layers_.size());
    const int64_t groups = heads_ / kv_heads_;
    std::vector<torch::Tensor> out{torch::Tensor()};
    auto captured = [&](int64_t i) { return std::find(capture.begin(), capture.end(), i) != capture.end(); };
    for (int64_t i = 0; i < L; ++i) {
      const LayerWeights& w = layers_[i];
      if (captured(i)) out.push_back(x);
      auto k_cache = k.select(0, i), v_cache = v.select(0, i);
      auto normed = w.input_norm.has_value() ? rms_norm(x, *w.input_norm, eps_) : x;
      const auto& c = w.local_rope ? *cos_local : cos;
      const auto& s = w.local_rope ? *sin_local : sin;
      auto q = rope_store(w.qkv(normed), c, s, k_cache, v_cache, start, heads_, kv_heads_, w.q_norm, w.k_norm, eps_);
      auto keys = k_cache.narrow(2, 0, end), values = v_cache.narrow(2, 0, end);
      const int64_t D = q.size(3);
      const auto& m = w.windowed ? mask_windowed : mask;
      torch::Tensor y;
      if (!m.has_value() && T > 1) {
        y = at::scaled_dot_product_attention(q, keys, values, {}, 0.0, true, scale_, heads_ != kv_heads_);
      } else {
        y = row_attention(q.reshape({B, kv_heads_, groups * T, D}), keys, values, m, scale_).view({B, heads_, T, D});
      }
      y = w.o(y.transpose(1, 2).reshape({B, T, heads_ * D}));
      x = x + (w.attn_out_norm.has_value() ? rms_norm(y, *w.attn_out_norm, eps_) : y);
      y = mlp(w.mlp, rms_norm(x, w.post_attn_norm, eps_));
      x = x + (w.mlp_out_norm.has_value() ? rms_norm(y, *w.mlp_out_norm, eps_) : y);
    }
    if (captured(L)) out.push_back(x);
    out[0] = x;
    return out;
  }

 private:
  // x [B, T, H] through a layer's MLP: gated, or its experts as decoder.Experts runs them
  torch::Tensor mlp(const std::vector<LinearSpec>& m, const torch::Tensor& x) const {
    if (m.size() == 2) return m[1](gated(m[0](x), gelu_));
    const int64_t H = x.size(2);
    auto rows = x.reshape({1, -1, H});
    auto chosen_weights = at::softmax(m[0](rows).to(at::kFloat), -1).topk(top_k_, -1);
    auto weights = std::get<0>(chosen_weights);
    const auto chosen = std::get<1>(chosen_weights).squeeze(0);  // [M, k]
    if (normalize_) weights = weights / weights.sum(-1, true);
    weights = weights.to(x.scalar_type()).squeeze(0);
    auto out = at::zeros_like(rows.squeeze(0));
    const auto picks = std::get<0>(at::_unique(chosen, true));  // ascending
    const auto* ids = picks.data_ptr<int64_t>();
    for (int64_t i = 0; i < picks.numel(); ++i) {
      const int64_t e = ids[i];
      const auto where = at::nonzero(chosen == e);
      const auto picked = where.select(1, 0), slot = where.select(1, 1);
      auto y = m[2 + 2 * e](gated(m[1 + 2 * e](rows.index_select(1, picked)), gelu_)).squeeze(0);
      out.index_add_(0, picked, y * weights.index({picked, slot}).unsqueeze(-1));
    }
    if (m.size() == 4 + 2 * static_cast<size_t>(experts_)) {  // the shared expert, under its sigmoid gate
      const size_t s = 1 + 2 * experts_;
      out = out + (at::sigmoid(m[s + 2](rows)) * m[s + 1](gated(m[s](rows), gelu_))).squeeze(0);
    }
    return out.view(x.sizes());
  }

  std::vector<LayerWeights> layers_;
  int64_t heads_, kv_heads_;
  double eps_, scale_;
  bool gelu_;
  int64_t experts_, top_k_;
  bool normalize_;
};

}  // namespace

void bind_layer_stack(pybind11::module& module) {
  pybind11::class_<LayerStack>(module, "LayerStack")
      .def(pybind11::init<Norms, std::vector<bool>, Linears, std::vector<Linears>, int64_t, int64_t, double, double, bool,
                          int64_t, int64_t, bool>())
      .def("run", &LayerStack::run);
}
