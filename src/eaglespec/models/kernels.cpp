// The Python module of our CPU kernels (see kernels.py).

#include <torch/extension.h>

torch::Tensor row_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, c10::optional<torch::Tensor> mask,
                            double scale);
torch::Tensor row_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias);
bool row_linear_available();

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("row_attention", &row_attention, "Row-invariant attention for decoding and verification (CPU)");
  module.def("row_linear", &row_linear, "Row-invariant linear layer over fp32 weights for decoding and verification (CPU)");
  module.def("row_linear_available", &row_linear_available, "Whether row_linear was built (it needs AVX2)");
}
