// The tensor form of each update rule against the fused CPU loop it stands in for, on CPU
// tensors: the same scalars give the same values to fp32 rounding.
#include "optim/internal/tensor_updates.h"

#include <functional>

#include "gtest/gtest.h"
#include "optim/internal/fused_kernels.h"
#include "torch/torch.h"

namespace plait::optim::internal {
namespace {

constexpr int64_t kSize = 1000;

// Parameter, gradient and two state buffers of kSize elements, seeded.
struct State {
  torch::Tensor p, g, a, b;
  State() {
    torch::manual_seed(7);
    p = torch::randn({kSize});
    g = torch::randn({kSize});
    a = torch::randn({kSize});
    b = torch::rand({kSize});  // Adam's second moment is never negative
  }
  State Clone() const {
    State copy;
    copy.p = p.clone();
    copy.g = g.clone();
    copy.a = a.clone();
    copy.b = b.clone();
    return copy;
  }
};

void ExpectClose(const torch::Tensor& got, const torch::Tensor& want, const char* what) {
  EXPECT_TRUE(torch::allclose(got, want, /*rtol=*/1e-6, /*atol=*/1e-6))
      << what << ": max difference " << (got - want).abs().max().item<float>();
}

// The update changed the parameter (so that matching it means something).
void ExpectMoved(const torch::Tensor& p) { EXPECT_FALSE(torch::equal(p, State().p)); }

TEST(TensorUpdatesTest, AdamMatchesTheFusedLoop) {
  for (const bool adamw : {true, false}) {
    const AdamScalars s{adamw ? 0.99f : 1.0f,
                        adamw ? 0.0f : 0.01f,
                        0.9f,
                        0.1f,
                        0.999f,
                        0.001f,
                        0.3f,
                        1e-8f,
                        -0.01f};
    const State fused = State().Clone();
    State tensors = fused.Clone();
    AdamUpdate(s, kSize, fused.p.data_ptr<float>(), fused.g.data_ptr<float>(),
               fused.a.data_ptr<float>(), fused.b.data_ptr<float>());
    AdamUpdate(s, tensors.p, tensors.g, tensors.a, tensors.b);
    ExpectMoved(fused.p);
    ExpectClose(tensors.p, fused.p, "parameter");
    ExpectClose(tensors.a, fused.a, "first moment");
  }
}

TEST(TensorUpdatesTest, SgdMatchesTheFusedLoop) {
  for (const float momentum : {0.0f, 0.9f}) {
    for (const bool first_step : {true, false}) {
      for (const bool nesterov : {true, false}) {
        const SgdScalars s{0.01f, momentum, 0.9f, nesterov, first_step, -0.1f};
        const State fused = State().Clone();
        State tensors = fused.Clone();
        torch::Tensor buffer = momentum != 0.0f ? tensors.a : torch::Tensor();
        SgdUpdate(s, kSize, fused.p.data_ptr<float>(), fused.g.data_ptr<float>(),
                  momentum != 0.0f ? fused.a.data_ptr<float>() : nullptr);
        SgdUpdate(s, tensors.p, tensors.g, buffer);
        ExpectMoved(fused.p);
        ExpectClose(tensors.p, fused.p, "parameter");
        ExpectClose(tensors.a, fused.a, "momentum buffer");
      }
    }
  }
}

TEST(TensorUpdatesTest, LionMatchesTheFusedLoop) {
  const LionScalars s{0.999f, 0.01f, 0.9f, 0.1f, 0.99f, 0.01f};
  const State fused = State().Clone();
  State tensors = fused.Clone();
  LionUpdate(s, kSize, fused.p.data_ptr<float>(), fused.g.data_ptr<float>(),
             fused.a.data_ptr<float>());
  LionUpdate(s, tensors.p, tensors.g, tensors.a);
  ExpectMoved(fused.p);
  ExpectClose(tensors.p, fused.p, "parameter");
  ExpectClose(tensors.a, fused.a, "momentum");
}

}  // namespace
}  // namespace plait::optim::internal
