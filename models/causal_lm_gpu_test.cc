// The model on CUDA against the same model on the CPU: the generic LibTorch path the GPU takes
// (cuBLAS matmuls, the composite ops, LibTorch's fused attention where the version has it)
// gives the CPU's fused kernels' loss and gradients, in fp32 with TF32 off to fp32 rounding
// (1e-4; TF32 would show as ~1e-3) and in bf16 to bf16's precision, for Llama and for Qwen2
// (biases) with grouped-query heads.
#include <map>
#include <memory>
#include <string>

#include "base/status_matchers.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/model_config.h"
#include "torch/torch.h"

namespace plait::models {
namespace {

using ::plait::base::testing::IsOk;

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

struct LossAndGradients {
  double loss;
  std::map<std::string, torch::Tensor> gradients;  // on the CPU, fp32
};

LossAndGradients ForwardBackward(const ModelConfig& config, torch::Device device,
                                 torch::ScalarType dtype) {
  InitConfig init;
  init.set_seed(11);
  absl::StatusOr<std::shared_ptr<CausalLM>> model = CausalLM::Create(config, init);
  EXPECT_THAT(model, IsOk());
  (*model)->to(device, dtype);
  torch::manual_seed(5);
  const torch::Tensor sequence = torch::randint(config.vocab_size(), {4, 65}, torch::kInt64);
  const torch::Tensor loss =
      (*model)->Loss(sequence.narrow(1, 0, 64).to(device), sequence.narrow(1, 1, 64).to(device));
  loss.backward();
  LossAndGradients result{loss.item<double>(), {}};
  for (const auto& item : (*model)->named_parameters()) {
    result.gradients[item.key()] = item.value().grad().to(torch::kCPU, torch::kFloat32);
  }
  return result;
}

class CudaAgainstCpuTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
    ASSERT_FALSE(at::globalContext().allowTF32CuBLAS()) << "fp32 comparisons need TF32 off";
  }
};

void ExpectClose(const LossAndGradients& got, const LossAndGradients& want, double tolerance) {
  EXPECT_NEAR(got.loss, want.loss, tolerance * want.loss);
  ASSERT_EQ(got.gradients.size(), want.gradients.size());
  for (const auto& [name, gradient] : want.gradients) {
    const double error =
        (got.gradients.at(name) - gradient).norm().item<double>() / gradient.norm().item<double>();
    EXPECT_LE(error, tolerance) << name;
  }
}

TEST_P(CudaAgainstCpuTest, Fp32LossAndGradientsMatch) {
  const ModelConfig config = Small(GetParam());
  ExpectClose(ForwardBackward(config, torch::Device(torch::kCUDA, 0), torch::kFloat32),
              ForwardBackward(config, torch::kCPU, torch::kFloat32), 1e-4);
}

// bf16 on CUDA against fp32 on the CPU: to bf16's 8-bit mantissa, summed over the layers.
TEST_P(CudaAgainstCpuTest, Bf16LossAndGradientsMatch) {
  const ModelConfig config = Small(GetParam());
  ExpectClose(ForwardBackward(config, torch::Device(torch::kCUDA, 0), torch::kBFloat16),
              ForwardBackward(config, torch::kCPU, torch::kFloat32), 5e-2);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaAgainstCpuTest, ::testing::Values("llama", "qwen2"));

}  // namespace
}  // namespace plait::models
