#include "base/dtype.h"

namespace plait::base {

torch::ScalarType ToScalarType(Dtype dtype, torch::ScalarType unspecified) {
  switch (dtype) {
    case DTYPE_FLOAT32:
      return torch::kFloat32;
    case DTYPE_BFLOAT16:
      return torch::kBFloat16;
    case DTYPE_FLOAT16:
      return torch::kFloat16;
    default:
      return unspecified;
  }
}

}  // namespace plait::base
