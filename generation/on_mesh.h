// Completions of prompts by a prepared model on every rank of its mesh: each data-parallel
// rank generates its own block of the prompts (the ranks of a step that splits the layers,
// tensor parallelism's, the same block together), every rank decodes until the last
// completion on any rank has ended (GenerateOptions::any_rank_open), and every rank returns
// all the completions, prompt by prompt and sample by sample: those of one process, since each
// completion's draws depend on its prompt's index and its sample alone (Sampler). Under a
// strategy that gathers whole parameters for a forward (FSDP), `keep_gathered` gathers them
// once for the phase (wrap::Preparation::KeepGathered), else they are gathered a block at a
// time for every decoded token, holding no more than a training step's forward does.
//
//   PLAIT_ASSIGN_OR_RETURN(std::vector<Completion> completions,
//                          GenerateOnMesh(*prepared, mesh, prompts, config,
//                                         {.end_of_sequence = eos}, /*keep_gathered=*/true));
#ifndef PLAIT_GENERATION_ON_MESH_H_
#define PLAIT_GENERATION_ON_MESH_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "generation/generate.h"
#include "generation/sampling.pb.h"
#include "parallel/device_mesh.h"
#include "prepared/prepared_model.h"

namespace plait::generation {

// Every rank of `mesh`, on which `prepared` was prepared, must call it with the same
// arguments. `options.first_prompt` numbers prompts[0] (and so seeds its draws);
// `options.any_rank_open` is set here. Errors as Generate's, found on every rank before any
// decoding; one that a rank meets while decoding (its stop strings' text) stops every rank at
// that token, the others with Aborted.
absl::StatusOr<std::vector<Completion>> GenerateOnMesh(
    prepared::PreparedModel& prepared, const parallel::DeviceMesh& mesh,
    const std::vector<std::vector<int64_t>>& prompts, const SamplingConfig& config,
    GenerateOptions options, bool keep_gathered);

}  // namespace plait::generation

#endif  // PLAIT_GENERATION_ON_MESH_H_
