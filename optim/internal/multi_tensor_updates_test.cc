// The multi-tensor form of each update rule against the fused CPU loop it stands in for, on a
// bucket of CPU tensors of different sizes: the same step gives the same values to fp32
// rounding. On LibTorch 2.x this runs ATen's fused Adam(W) and SGD kernels; on 1.13 the
// foreach operations.
#include "optim/internal/multi_tensor_updates.h"

#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/allclose.h"
#include "ATen/ops/equal.h"
#include "gtest/gtest.h"
#include "optim/internal/fused_kernels.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::optim::internal {
namespace {

const std::vector<int64_t> kSizes = {1000, 37, 1};

// Per tensor of the bucket: parameter, gradient and two state buffers, seeded.
struct State {
  std::vector<at::Tensor> p, g, a, b;
  State() {
    at::manual_seed(7);
    for (const int64_t size : kSizes) {
      p.push_back(torch::randn({size}));
      g.push_back(torch::randn({size}));
      a.push_back(torch::randn({size}));
      b.push_back(torch::rand({size}));  // Adam's second moment is never negative
    }
  }
  State Clone() const {
    State copy;
    for (size_t i = 0; i < p.size(); ++i) {
      copy.p[i] = p[i].clone();
      copy.g[i] = g[i].clone();
      copy.a[i] = a[i].clone();
      copy.b[i] = b[i].clone();
    }
    return copy;
  }
};

void ExpectClose(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want,
                 const char* what) {
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(at::allclose(got[i], want[i], /*rtol=*/1e-6, /*atol=*/1e-6))
        << what << " " << i << ": max difference " << (got[i] - want[i]).abs().max().item<float>();
  }
}

// The update changed every parameter (so that matching them means something).
void ExpectMoved(const std::vector<at::Tensor>& p) {
  const State initial;
  for (size_t i = 0; i < p.size(); ++i) EXPECT_FALSE(at::equal(p[i], initial.p[i])) << i;
}

TEST(MultiTensorUpdatesTest, AdamMatchesTheFusedLoop) {
  for (const bool decoupled : {true, false}) {
    for (const int64_t step : {1, 7}) {
      SCOPED_TRACE(testing::Message() << "decoupled " << decoupled << ", step " << step);
      const AdamStep s{.decoupled = decoupled,
                       .lr = 0.01,
                       .weight_decay = 0.1,
                       .beta1 = 0.9,
                       .beta2 = 0.999,
                       .eps = 1e-8,
                       .step = step};
      State fused;
      State buckets = fused.Clone();
      for (size_t i = 0; i < kSizes.size(); ++i) {
        AdamUpdate(ScalarsOf(s), kSizes[i], fused.p[i].data_ptr<float>(),
                   fused.g[i].data_ptr<float>(), fused.a[i].data_ptr<float>(),
                   fused.b[i].data_ptr<float>());
      }
      AdamUpdate(s, buckets.p, buckets.g, buckets.a, buckets.b);
      ExpectMoved(fused.p);
      ExpectClose(buckets.p, fused.p, "parameter");
      ExpectClose(buckets.a, fused.a, "first moment");
      ExpectClose(buckets.b, fused.b, "second moment");
    }
  }
}

TEST(MultiTensorUpdatesTest, SgdMatchesTheFusedLoop) {
  for (const double momentum : {0.0, 0.9}) {
    for (const bool first_step : {true, false}) {
      for (const bool nesterov : {true, false}) {
        for (const double dampening : {0.0, 0.1}) {
          if (nesterov && (momentum == 0.0 || dampening != 0.0)) continue;  // as Create rejects
          SCOPED_TRACE(testing::Message() << "momentum " << momentum << ", first " << first_step
                                          << ", nesterov " << nesterov << ", dampening "
                                          << dampening);
          const SgdStep s{.lr = 0.1,
                          .weight_decay = 0.01,
                          .momentum = momentum,
                          .dampening = dampening,
                          .nesterov = nesterov,
                          .first_step = first_step};
          State fused;
          State buckets = fused.Clone();
          for (size_t i = 0; i < kSizes.size(); ++i) {
            SgdUpdate(ScalarsOf(s), kSizes[i], fused.p[i].data_ptr<float>(),
                      fused.g[i].data_ptr<float>(),
                      momentum != 0.0 ? fused.a[i].data_ptr<float>() : nullptr);
          }
          SgdUpdate(s, buckets.p, buckets.g,
                    momentum != 0.0 ? at::TensorList(buckets.a) : at::TensorList());
          ExpectMoved(fused.p);
          ExpectClose(buckets.p, fused.p, "parameter");
          ExpectClose(buckets.a, fused.a, "momentum buffer");
        }
      }
    }
  }
}

TEST(MultiTensorUpdatesTest, LionMatchesTheFusedLoop) {
  const LionStep s{.lr = 0.01, .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.99};
  State fused;
  State buckets = fused.Clone();
  for (size_t i = 0; i < kSizes.size(); ++i) {
    LionUpdate(ScalarsOf(s), kSizes[i], fused.p[i].data_ptr<float>(),
               fused.g[i].data_ptr<float>(), fused.a[i].data_ptr<float>());
  }
  LionUpdate(s, buckets.p, buckets.g, buckets.a);
  ExpectMoved(fused.p);
  ExpectClose(buckets.p, fused.p, "parameter");
  ExpectClose(buckets.a, fused.a, "momentum");
}

}  // namespace
}  // namespace plait::optim::internal
