// Registers vLLM 0.33.0's decode top-k kernels under the benchmark's own op
// namespace "rs8vb", so they can be timed beside rs8 without installing vLLM.
// Compiled together with vLLM's csrc/sampler.cu, topk.cu and cooperative_topk.cu
// (fetched from vLLM's released sdist at benchmark time, never committed) by
// bench/build_vllm_topk.py.  This file is our own glue, not vLLM code.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include "ops.h"

STABLE_TORCH_LIBRARY(rs8vb, m) {
  m.def(
      "top_k_per_row_decode(Tensor logits, int next_n, Tensor seq_lens, Tensor! indices, "
      "int numRows, int stride0, int stride1, int topK) -> ()");
  m.def(
      "persistent_topk(Tensor logits, Tensor lengths, Tensor! output, Tensor workspace, "
      "int k, int max_seq_len) -> ()");
  m.def(
      "cooperative_topk(Tensor logits, Tensor lengths, Tensor! output, Tensor workspace, "
      "int k, int max_seq_len) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(rs8vb, CUDA, m) {
  m.impl("top_k_per_row_decode", TORCH_BOX(&top_k_per_row_decode));
  m.impl("persistent_topk", TORCH_BOX(&persistent_topk));
  m.impl("cooperative_topk", TORCH_BOX(&cooperative_topk));
}
