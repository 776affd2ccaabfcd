// The model on CUDA against the same model on the CPU: the generic LibTorch path the GPU takes
// (cuBLAS matmuls, the composite ops, LibTorch's fused attention where the version has it)
// gives the CPU's fused kernels' loss and gradients, in fp32 with TF32 off to fp32 rounding
// (1e-4; TF32 would show as ~1e-3) and in bf16 to bf16's precision, for Llama and for Qwen2
// (biases) with grouped-query heads and some targets ignored. Hugging Face weights load into
// CUDA parameters, converted to their dtype. Skips without a GPU.
#include <memory>
#include <string>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/hf_checkpoint.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "models/testing_gradients.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/cuda.h"

namespace plait::models {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::models::testing::BackwardOf;
using ::plait::models::testing::ExpectClose;
using ::plait::models::testing::LossAndGradients;

// 2 layers, hidden 128, 8 heads of 16 sharing 2 kv heads: grouped-query attention on every path.
ModelConfig Small(const std::string& type) {
  ModelConfig config = PresetConfig("tiny").value();
  config.set_model_type(type);
  config.set_hidden_size(128);
  config.set_intermediate_size(192);
  config.set_num_hidden_layers(2);
  config.set_num_attention_heads(8);
  config.set_num_key_value_heads(2);
  config.set_vocab_size(211);
  return config;
}

std::shared_ptr<CausalLM> Make(const ModelConfig& config, uint64_t seed) {
  InitConfig init;
  init.set_seed(seed);
  absl::StatusOr<std::shared_ptr<CausalLM>> model = CausalLM::Create(config, init);
  EXPECT_THAT(model, IsOk());
  return *model;
}

LossAndGradients ForwardBackward(const ModelConfig& config, at::Device device,
                                 at::ScalarType dtype) {
  std::shared_ptr<CausalLM> model = Make(config, 11);
  model->to(device, dtype);
  at::manual_seed(5);
  const at::Tensor sequence = torch::randint(config.vocab_size(), {4, 65}, at::kLong);
  at::Tensor targets = sequence.narrow(1, 1, 64).clone();
  targets.narrow(1, 0, 5).fill_(kIgnoreIndex);  // a prompt, say
  return BackwardOf(*model, model->Loss(sequence.narrow(1, 0, 64).to(device), targets.to(device)));
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
    // TF32 matmuls round fp32 operands to 10 bits of mantissa: the fp32 comparisons need it
    // off, whatever TORCH_ALLOW_TF32_CUBLAS_OVERRIDE says.
    at::globalContext().setAllowTF32CuBLAS(false);
    at::globalContext().setAllowTF32CuDNN(false);
    ASSERT_FALSE(at::globalContext().allowTF32CuBLAS());
  }
};

class CudaAgainstCpuTest : public CudaTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(CudaAgainstCpuTest, Fp32LossAndGradientsMatch) {
  const ModelConfig config = Small(GetParam());
  ExpectClose(ForwardBackward(config, at::Device(at::kCUDA, 0), at::kFloat),
              ForwardBackward(config, at::kCPU, at::kFloat), 1e-4);
}

// bf16 on CUDA against fp32 on the CPU: to bf16's 8-bit mantissa, summed over the layers.
TEST_P(CudaAgainstCpuTest, Bf16LossAndGradientsMatch) {
  const ModelConfig config = Small(GetParam());
  ExpectClose(ForwardBackward(config, at::Device(at::kCUDA, 0), at::kBFloat16),
              ForwardBackward(config, at::kCPU, at::kFloat), 5e-2);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaAgainstCpuTest, ::testing::Values("llama", "qwen2"));

// A micro-batch that scores nothing: 0, with zero gradients, computed on the device.
TEST_F(CudaTest, LossOfABatchWithNothingScoredIsZero) {
  const at::Device device(at::kCUDA, 0);
  std::shared_ptr<CausalLM> model = Make(Small("llama"), 3);
  model->to(device);
  const at::Tensor loss =
      model->Loss(torch::zeros({2, 8}, at::TensorOptions(at::kLong).device(device)),
                  torch::full({2, 8}, kIgnoreIndex, at::TensorOptions(at::kLong).device(device)));
  EXPECT_TRUE(loss.is_cuda());
  loss.backward();
  EXPECT_EQ(loss.item<float>(), 0.0f);
  for (const at::Tensor& parameter : model->parameters()) {
    EXPECT_EQ(parameter.grad().abs().max().item<float>(), 0.0f);
  }
}

// Hugging Face weights (fp32 on disk) read into bf16 CUDA parameters, whole and as a
// tensor-parallel rank's column slice (a strided view of a CUDA tensor).
TEST_F(CudaTest, HfWeightsLoadIntoCudaParameters) {
  const ModelConfig config = Small("qwen2");
  std::shared_ptr<CausalLM> saved = Make(config, 1);
  const std::string dir = base::testing::FreshTestDir("hf");
  ASSERT_THAT(SaveHfModel(*saved, dir), IsOk());
  std::shared_ptr<CausalLM> loaded = Make(config, 2);
  loaded->to(at::Device(at::kCUDA, 0), at::kBFloat16);
  absl::StatusOr<SafetensorsCheckpoint> checkpoint = SafetensorsCheckpoint::Open(dir);
  ASSERT_THAT(checkpoint, IsOk());
  ASSERT_THAT(LoadHfWeights(*checkpoint, *loaded), IsOk());
  auto want = saved->named_parameters();
  for (const auto& item : loaded->named_parameters()) {
    ASSERT_TRUE(item.value().is_cuda()) << item.key();
    EXPECT_TRUE(at::equal(item.value().cpu(), want[item.key()].to(at::kBFloat16))) << item.key();
  }
  const std::string name = "model.layers.0.mlp.down_proj.weight";  // [128, 192]
  auto found = checkpoint->Find(name);
  ASSERT_THAT(found, IsOk());
  at::Tensor parameter =
      torch::zeros({128, 100}, at::TensorOptions(at::kFloat).device(at::kCUDA, 0));
  ASSERT_THAT(found->second->ReadBox(name, {0, 96}, {128, 96}, parameter.narrow(1, 2, 96)), IsOk());
  EXPECT_TRUE(at::equal(parameter.narrow(1, 2, 96).cpu(), want[name].narrow(1, 96, 96)));
  EXPECT_EQ(parameter.narrow(1, 0, 2).abs().max().item<float>(), 0.0f);
}

}  // namespace
}  // namespace plait::models
