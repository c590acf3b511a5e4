// The Python module of our CPU kernels (see kernels.py).

#include <torch/extension.h>

#include <string>

torch::Tensor row_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, c10::optional<torch::Tensor> mask,
                            double scale);
torch::Tensor row_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias);
bool row_linear_available();
torch::Tensor pack_bf16(torch::Tensor w);
torch::Tensor row_linear_bf16(torch::Tensor x, torch::Tensor packed, int64_t N, c10::optional<torch::Tensor> bias);
bool row_linear_bf16_available();
std::string row_linear_bf16_unit();
torch::Tensor pack_int4(torch::Tensor codes, torch::Tensor scale, torch::Tensor low);
torch::Tensor row_linear_int4(torch::Tensor x, torch::Tensor packed, int64_t N);
bool row_linear_int4_available();
std::string row_linear_int4_inputs();
torch::Tensor pack_int8(torch::Tensor codes);
torch::Tensor row_linear_int8(torch::Tensor x, torch::Tensor packed, torch::Tensor scale, int64_t N);
bool row_linear_int8_available();
std::string row_linear_int8_inputs();
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps);
torch::Tensor gated(torch::Tensor x, bool gelu);
torch::Tensor rope_store(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor k_cache,
                         torch::Tensor v_cache, int64_t start, int64_t heads, int64_t kv_heads,
                         c10::optional<torch::Tensor> q_norm, c10::optional<torch::Tensor> k_norm, double eps);

void bind_layer_stack(pybind11::module& module);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  bind_layer_stack(module);
  module.def("row_attention", &row_attention, "Row-invariant attention for decoding and verification (CPU)");
  module.def("row_linear", &row_linear, "Row-invariant linear layer over fp32 weights for decoding and verification (CPU)");
  module.def("row_linear_available", &row_linear_available, "Whether row_linear was built (it needs AVX2)");
  module.def("pack_bf16", &pack_bf16, "bf16 weights [N, K] in row_linear_bf16's layout");
  module.def("row_linear_bf16", &row_linear_bf16, "Row-invariant linear layer over packed bf16 weights and bf16 inputs (CPU)");
  module.def("row_linear_bf16_available", &row_linear_bf16_available,
             "Whether row_linear_bf16 was built (it needs AVX2)");
  module.def("row_linear_bf16_unit", &row_linear_bf16_unit,
             "What runs row_linear_bf16 (and row_linear_int4): amx (for K a multiple of 32), avx512-bf16, avx2 or none");
  module.def("pack_int4", &pack_int4, "4-bit weights (codes, scale, low) in row_linear_int4's layout");
  module.def("row_linear_int4", &row_linear_int4, "Row-invariant linear layer over packed 4-bit weights and bf16 inputs (CPU)");
  module.def("row_linear_int4_available", &row_linear_int4_available,
             "Whether row_linear_int4 was built (it needs AVX2)");
  module.def("row_linear_int4_inputs", &row_linear_int4_inputs,
             "How row_linear_int4 takes its inputs: bf16 (AVX-512 BF16, AMX), int8 (AVX2: 8-bit codes per group of 32) or none");
  module.def("pack_int8", &pack_int8, "8-bit codes in row_linear_int8's layout");
  module.def("row_linear_int8", &row_linear_int8, "Row-invariant linear layer over packed 8-bit weights and bf16 inputs (CPU)");
  module.def("row_linear_int8_available", &row_linear_int8_available, "Whether row_linear_int8 was built (it needs AVX2)");
  module.def("row_linear_int8_inputs", &row_linear_int8_inputs,
             "How row_linear_int8 takes its inputs: bf16 (AVX-512), int8 (AVX2: 8-bit codes per group of 32) or none");
  module.def("rms_norm", &rms_norm, "RMSNorm, one call (CPU)");
  module.def("gated", &gated, "act(gate) * up over the halves of the last axis, act SiLU or GELU (tanh), one call (CPU)");
  module.def("rope_store", &rope_store, "Rotary embedding of q and k and the cache write of k and v, one call (CPU)");
}
