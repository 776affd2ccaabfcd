// The names and shapes of a model's parameters, computed from its config without building
// the model: what a plan's validator and explainer need to know of an 8B model without
// allocating it. Names and order are those of CausalLM::NamedParameters (Hugging Face names,
// e.g. "model.layers.0.self_attn.q_proj.weight"); a test holds the two equal.
#ifndef PLAIT_MODELS_PARAMETER_SHAPES_H_
#define PLAIT_MODELS_PARAMETER_SHAPES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "models/model.pb.h"

namespace plait::models {

struct ParameterShape {
  std::string name;
  std::vector<int64_t> shape;

  int64_t numel() const;
};

// The parameters of the model `config` (which must be valid, see ValidateModelConfig)
// describes, in registration order; a tied output projection is the embedding's, listed once.
std::vector<ParameterShape> ParameterShapes(const ModelConfig& config);

}  // namespace plait::models

#endif  // PLAIT_MODELS_PARAMETER_SHAPES_H_
