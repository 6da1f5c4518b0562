// A minimal torch CUDA extension: y = x * scale, one thread per element.
// Stand-in for the CUDA sources a patch adds but vLLM's wheel never compiles (vLLM-Moet's
// csrc/nvfp4_ds_mla/*.cu): the sm120-probe-ext step builds it after install, in a
// container, for the archs the part names.
#include <torch/extension.h>

__global__ void scale_kernel(const float* x, float* y, float scale, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = x[i] * scale;
}

torch::Tensor scale(torch::Tensor x, double s) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "a float32 CUDA tensor");
  auto xc = x.contiguous();
  auto y = torch::empty_like(xc);
  int64_t n = xc.numel();
  int threads = 256;
  int64_t blocks = (n + threads - 1) / threads;
  if (n > 0) {
    scale_kernel<<<blocks, threads>>>(xc.data_ptr<float>(), y.data_ptr<float>(),
                                      static_cast<float>(s), n);
  }
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("scale", &scale, "y = x * scale"); }
