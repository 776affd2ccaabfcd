// Estimates of what a model of a ModelConfig costs, computed from the config alone (nothing
// is built): its parameter count, its training FLOPs per token (the numerator of MFU), and
// the activation bytes a micro-batch holds on one rank, beside the model (causal_lm.h) whose
// ops they count. The plan's memory estimate (plan/memory_estimate.h) and the trainer's MFU
// read them:
//
//   const double flops = TrainingFlopsPerToken(config, /*seq_len=*/2048);
//   const double bytes = ActivationBytes(config, 8, 2048, at::kBFloat16, at::kCUDA);
#ifndef PLAIT_MODELS_ESTIMATES_H_
#define PLAIT_MODELS_ESTIMATES_H_

#include <cstdint>

#include "ATen/core/Tensor.h"
#include "base/torch_compat.h"
#include "models/flop_convention.h"
#include "models/model.pb.h"

namespace plait::models {

// Model FLOPs of one token's forward and backward pass at sequence length `seq_len`, the
// numerator of model FLOPs utilisation, by the one convention plait states beside every MFU
// figure (kFlopConvention; Megatron-LM's count):
//   6 * (matmul parameters) + 6 * num_hidden_layers * seq_len * h
// where the matmul parameters are those of q/k/v/o, gate/up/down in every layer plus the
// output projection (counted once even when tied; the embedding lookup is not a matmul), each
// used for 2 FLOPs per token forward and 4 backward, of a mixture-of-experts layer only those a
// token meets (the router and num_experts_per_tok experts: the active parameters); and the
// attention term counts Q K^T and P V (2 * seq_len * h FLOPs each per token and layer forward,
// h the query heads' width, num_attention_heads * head_dim, twice that backward) over the causal
// half of the seq_len x seq_len score matrix, which is all a causal model needs (PaLM's 12 * L * s
// * h counts the whole matrix). Recomputation under activation checkpointing is not model FLOPs.
double TrainingFlopsPerToken(const ModelConfig& config, int64_t seq_len);

// Model FLOPs of one token's forward pass alone (a frozen model's), by the same convention:
// a third of TrainingFlopsPerToken (2 of its 6 FLOPs per matmul parameter, 4 of its 12 for
// attention).
double ForwardFlopsPerToken(const ModelConfig& config, int64_t seq_len);

// The number of parameters of the model `config` describes (tied embeddings counted once).
int64_t NumParameters(const ModelConfig& config);

// Those one token's forward uses: all but the experts it does not choose
// (num_experts - num_experts_per_tok of each mixture-of-experts layer); NumParameters for a
// dense model.
int64_t NumActiveParameters(const ModelConfig& config);

// How a step that splits the model's layers over the `size` ranks of a group (Megatron's
// layout, ParameterSplitOf) splits a micro-batch's activations, for the estimates below: each
// rank computes its attention heads, its columns of the MLP's intermediate and its slice of
// the logits (the vocabulary over `size`, rounded up where the step pads it; a vocabulary that
// does not divide is otherwise refused), and with `sequence_parallel` holds only its slice of
// the sequence of the [tokens, hidden] tensors between the matmuls. The default is one process.
struct LayerSplit {
  int64_t size = 1;
  bool sequence_parallel = false;
};

// What of LibTorch's own kernels the activation estimates below assume where plait's fused
// forms do not serve: this build's LibTorch (the default), or another's, for a plan checked
// for a machine whose LibTorch is not this one (a GPU cluster's CUDA build, LibTorch 2.x:
// kLibTorch2Kernels).
struct LibTorchKernels {
  bool mean_keeps_its_input = base::kMeanKeepsItsInput;  // base/torch_compat.h
  bool has_causal_sdpa = base::kHasCausalSdpa;
};
inline constexpr LibTorchKernels kLibTorch2Kernels{/*mean_keeps_its_input=*/false,
                                                   /*has_causal_sdpa=*/true};

// Bytes of activations a micro-batch of `batch` sequences of `seq_len` tokens holds at the
// peak of its backward on one rank of `tp`, for a model computing in `dtype` on
// `device_type`: what CausalLM's ops save in the forward for the backward
// (models/internal/ops.h), which depends on whether the fused forms serve the dtype (on the
// CPU: fp32, fp64, bf16) and, where they do not, on `kernels`: whether the LibTorch has a fused
// attention and what its mean keeps; plus, outside the blocks, the final norm's and the loss's: the
// logits the loss keeps (in `dtype`), a log-sum-exp per token and the logits' gradient (and, for
// 16-bit logits, the chunked cross-entropy's one fp32 chunk of rows), all alive when the
// loss's backward runs, which is the peak (every later backward frees more activations than
// the gradients it makes). For memory estimates; a GPU's is tested on the CPU through the
// generic ops.
double ActivationBytes(const ModelConfig& config, int64_t batch, int64_t seq_len,
                       at::ScalarType dtype, at::DeviceType device_type, const LayerSplit& tp = {},
                       const LibTorchKernels& kernels = {});

// One block's part of ActivationBytes: what one block saves in its forward (its input
// included).
double BlockActivationBytes(const ModelConfig& config, int64_t batch, int64_t seq_len,
                            at::ScalarType dtype, at::DeviceType device_type,
                            const LayerSplit& tp = {}, const LibTorchKernels& kernels = {});

// Bytes of the outputs of one block's projections (q/k/v/o, gate/up/down) for a micro-batch on
// one rank of `tp` (o_proj's and down_proj's partial sums whole: they are summed after):
// what selective activation checkpointing keeps besides the block's input.
double BlockProjectionOutputBytes(const ModelConfig& config, int64_t batch, int64_t seq_len,
                                  double element_bytes, const LayerSplit& tp = {});

}  // namespace plait::models

#endif  // PLAIT_MODELS_ESTIMATES_H_
