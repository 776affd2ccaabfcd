#include "generation/on_mesh.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/full.h"
#include "ATen/ops/zeros.h"
#include "absl/status/status.h"
#include "base/status.h"

namespace plait::generation {
namespace {

// A completion as rows of two tables, which a sum over the mesh gathers: its prompt, sample,
// stop reason, length and max_new_tokens tokens (int64), and its max_new_tokens
// log-probabilities and sampling log-probabilities (fp32; a sum with zeros keeps them exact).
constexpr int64_t kHeader = 4;

void Pack(const Completion& completion, int64_t max_new_tokens, at::Tensor ids, at::Tensor values) {
  const auto length = static_cast<int64_t>(completion.tokens.size());
  int64_t* id = ids.data_ptr<int64_t>();
  float* value = values.data_ptr<float>();
  id[0] = completion.prompt;
  id[1] = completion.sample;
  id[2] = static_cast<int64_t>(completion.stop);
  id[3] = length;
  std::copy(completion.tokens.begin(), completion.tokens.end(), id + kHeader);
  std::copy(completion.logprobs.begin(), completion.logprobs.end(), value);
  std::copy(completion.sampling_logprobs.begin(), completion.sampling_logprobs.end(),
            value + max_new_tokens);
}

Completion Unpack(const int64_t* id, const float* value, int64_t max_new_tokens) {
  Completion completion;
  completion.prompt = id[0];
  completion.sample = id[1];
  completion.stop = static_cast<StopReason>(id[2]);
  const int64_t length = id[3];
  completion.tokens.assign(id + kHeader, id + kHeader + length);
  completion.logprobs.assign(value, value + length);
  completion.sampling_logprobs.assign(value + max_new_tokens, value + max_new_tokens + length);
  return completion;
}

}  // namespace

absl::StatusOr<std::vector<Completion>> GenerateOnMesh(
    prepared::PreparedModel& prepared, const parallel::DeviceMesh& mesh,
    const std::vector<std::vector<int64_t>>& prompts, const SamplingConfig& config,
    GenerateOptions options, bool keep_gathered) {
  PLAIT_RETURN_IF_ERROR(CheckGeneration(prepared.model(), prompts, config, options));
  // This rank's block of the prompts: its data-parallel rank's.
  const std::vector<std::string> data_dims = prepared.preparation().DataParallelDims();
  PLAIT_ASSIGN_OR_RETURN(const auto data_rank, mesh.SubgridRankAndSize(data_dims));
  const auto [rank, ranks] = data_rank;
  std::vector<std::string> other_dims;
  for (const std::string& dim : mesh.layout().dim_names()) {
    if (std::find(data_dims.begin(), data_dims.end(), dim) == data_dims.end()) {
      other_dims.push_back(dim);
    }
  }
  // Of the ranks that generate the same block, the first reports it.
  PLAIT_ASSIGN_OR_RETURN(const auto peer, mesh.SubgridRankAndSize(other_dims));
  const auto count = static_cast<int64_t>(prompts.size());
  const int64_t block = (count + ranks - 1) / ranks;
  const int64_t begin = std::min(count, rank * block);
  const int64_t end = std::min(count, begin + block);
  const std::vector<std::vector<int64_t>> mine(prompts.begin() + begin, prompts.begin() + end);
  options.first_prompt += begin;
  // The most of 0 (done), 1 (drawing) and 2 (failed) over the mesh.
  options.any_rank_open = [&mesh](bool open_here, bool failed_here) -> absl::StatusOr<bool> {
    at::Tensor state = at::full({1},
                                failed_here ? 2
                                : open_here ? 1
                                            : 0,
                                at::TensorOptions(at::kLong).device(mesh.device()));
    PLAIT_RETURN_IF_ERROR(mesh.AllReduce(state, parallel::ReduceOp::kMax));
    if (state.item<int64_t>() == 2) {
      return absl::AbortedError("generation failed on another rank (see its error)");
    }
    return state.item<int64_t>() == 1;
  };

  std::vector<Completion> own;
  {
    std::optional<wrap::Preparation::KeepGathered> gathered;
    if (keep_gathered) gathered.emplace(prepared.preparation());
    PLAIT_ASSIGN_OR_RETURN(own, Generate(prepared.model(), mine, config, options));
  }

  // Every block's completions on every rank: each reporting rank fills its block's rows of
  // zero tables, which a sum over the mesh completes.
  const int64_t max_new = config.max_new_tokens();
  const int64_t samples = std::max(1, config.num_samples());
  const int64_t rows = block * samples;
  at::Tensor ids = at::zeros({ranks, rows, kHeader + max_new}, at::kLong);
  at::Tensor values = at::zeros({ranks, rows, 2 * max_new}, at::kFloat);
  if (peer.first == 0) {
    for (size_t i = 0; i < own.size(); ++i) Pack(own[i], max_new, ids[rank][i], values[rank][i]);
  }
  for (at::Tensor* table : {&ids, &values}) {
    at::Tensor reduced = table->to(mesh.device());
    PLAIT_RETURN_IF_ERROR(mesh.AllReduce(reduced, parallel::ReduceOp::kSum));
    *table = reduced.cpu().contiguous();
  }
  std::vector<Completion> completions;
  for (int64_t r = 0; r < ranks; ++r) {
    const int64_t block_rows =
        std::max<int64_t>(0, std::min(count, (r + 1) * block) - r * block) * samples;
    for (int64_t i = 0; i < block_rows; ++i) {
      completions.push_back(
          Unpack(ids[r][i].data_ptr<int64_t>(), values[r][i].data_ptr<float>(), max_new));
    }
  }
  return completions;
}

}  // namespace plait::generation
