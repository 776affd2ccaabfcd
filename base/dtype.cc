#include "base/dtype.h"

#include "ATen/core/Tensor.h"

namespace plait::base {

at::ScalarType ToScalarType(Dtype dtype, at::ScalarType unspecified) {
  switch (dtype) {
    case DTYPE_FLOAT32:
      return at::kFloat;
    case DTYPE_BFLOAT16:
      return at::kBFloat16;
    case DTYPE_FLOAT16:
      return at::kHalf;
    default:
      return unspecified;
  }
}

}  // namespace plait::base
