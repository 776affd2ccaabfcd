// plait_reference: plait's side of the reference tests (tests/reference/), which check
// plait's models, Hugging Face folders, schedules and optimizers against the Python stack
// (transformers, torch.optim) the way llm.c checks its C against PyTorch. Each command reads
// what the Python test wrote, computes with plait's own libraries, and writes what it
// computed for the test to compare:
//
//   plait_reference forward_backward --hf_dir=DIR --batch=BATCH --out=OUT
//   plait_reference save_hf --config=CONFIG_JSON --seed=S --hf_dir=DIR [--max_shard_bytes=N]
//                           --batch=BATCH --out=OUT
//   plait_reference train --hf_dir=DIR --batch=BATCH --optimizer=TEXT --schedule=TEXT
//                         --out=OUT [--save_dir=DIR]
//   plait_reference schedules --configs=CONFIGS --out=OUT
//   plait_reference optimizers --configs=CONFIGS --params=PARAMS --grads=GRADS --out=OUT
//   plait_reference dpo --hf_dir=POLICY --reference_dir=REFERENCE|--lora=TEXT --peft_dir=DIR
//                       --pairs=JSONL --configs=CONFIGS --out=OUT
//   plait_reference sft_step --hf_dir=DIR --batch=BATCH,BATCH...|--pairs=JSONL --seq_len=T
//                            --out=OUT
//   plait_reference lora --hf_dir=DIR --lora=TEXT --adapters=ADAPTERS|--peft_dir=DIR
//                        [--save_peft_dir=DIR] --batch=BATCH --out=OUT
//   plait_reference nf4 --weights=WEIGHTS --out=OUT
//   plait_reference generate --hf_dir=DIR --prompts=PROMPTS --max_new_tokens=N --out=OUT
//   plait_reference grpo_loss --inputs=INPUTS --configs=CONFIGS --out=OUT
//
// BATCH is a safetensors file of int64 `input_ids` and `labels` [B, T], with labels in
// Hugging Face's convention: aligned with the inputs, shifted inside the loss, -100 ignored.
// --optimizer and --schedule are text protos of optim.OptimizerConfig and
// sched.ScheduleConfig (for dpo: objectives.ObjectiveConfig); CONFIGS is a text file of several
// such configs, one per line, each run in turn (one process for all: LibTorch takes a second to
// load). Everything runs in fp32 on the CPU. Outputs:
//   forward_backward, save_hf: `logits` [B, T, V], `loss` [1] and `grad.<name>` for every
//     parameter, by its Hugging Face name (save_hf: of the model it saved, before saving);
//   train: `loss` [steps], the loss before each update, and `param.<name>` after the last;
//   schedules: a text file with a line per config: the learning rates of steps
//     0 .. total_steps;
//   optimizers: `<i>.<name>` [steps, ...], each parameter after every step under config i
//     (from 0). PARAMS holds the initial parameters; GRADS holds `<name>` [steps, ...], the
//     gradient of every step, and `lr` [steps], the learning rate of every step;
//   dpo: for config i, `<i>.loss` [1], `<i>.<metric>` [1] for every metric the objective
//     reports (TRL's names: `<i>.rewards/chosen`, ...) and `<i>.grad.<name>` for every policy
//     parameter that trains, of all the preference pairs of JSONL (data/pairs.h's format, read
//     with plait's own reader) in one micro-batch, right-padded to the longest sequence; with
//     --peft_dir, the policy trains the adapters of that PEFT folder (--lora's step starting
//     from it), and its configs may take the policy without them as the reference;
//   sft_step: `loss` [1] and `grad.<name>` for every parameter of one optimizer step of the
//     sft objective over the micro-batches BATCH,BATCH..., accumulated as the trainer does
//     (objectives/step_items.h, on a one-rank mesh); the loss as the trainer logs it. With
//     --pairs, one micro-batch of all the SFT examples of JSONL (token ids) packed by best-fit
//     decreasing into rows of T tokens (data.proto's PACKING_BFD, read by plait's DataLoader),
//     and the rows too: `inputs`, `targets` and `positions` [rows, T];
//   lora: the model with the adapters of --lora (a wrap.LoraConfig text proto) added by a
//     one-rank preparation: `init.<name>` [...] for every trainable parameter as plait drew
//     it, or as the PEFT adapter folder --peft_dir holds it (the step starts from the folder:
//     LoraConfig.initial_adapter_dir), then, with the adapters set to ADAPTERS' tensors (by
//     plait's names) or left as the folder's, `logits`, `loss` and
//     `grad.<name>` for every trainable parameter (those the optimizer owns); with
//     --save_peft_dir, the adapters saved there as a PEFT adapter folder;
//   nf4: for every tensor <name> of the safetensors file WEIGHTS (fp32 or bf16), its NF4 form
//     (wrap/lora/nf4.h) without double quantization, `<name>.nf4.packed` and
//     `<name>.nf4.absmax`, and with it, `<name>.nf4dq.packed`, `<name>.nf4dq.absmax_codes`,
//     `<name>.nf4dq.absmax_scales` and `<name>.nf4dq.absmax_offset` [1]; and each form
//     dequantized in the tensor's dtype, `<name>.nf4.dequantized`, `<name>.nf4dq.dequantized`
//     (the uint8 bytes and codes written as int64: plait's safetensors writer has no U8).
//   generate: for each prompt of the JSON file PROMPTS (a list of lists of token ids), its
//     greedy completion of --max_new_tokens tokens (generation::Generate, no end-of-sequence
//     id: it runs to the end), all prompts in one batch, written to OUT as JSON: a list of
//     {"tokens": [...], "logprobs": [...]}, each token's log-probability under the model.
//   grpo_loss: INPUTS holds fp32 `logps`, `old_logps`, `ref_logps` and `mask` [N, T] and
//     `rewards` [N]; CONFIGS objectives.Grpo text protos. For config i, GRPO's arithmetic
//     (objectives/grpo_loss.h): `<i>.advantages` [N], `<i>.loss` [1] of the completions as one
//     micro-batch, `<i>.grad` [N, T] its gradient in logps, and the masked means `<i>.kl`,
//     `<i>.clip_ratio/low_mean` and `<i>.clip_ratio/high_mean` [1].
// Exits 0 on success, 1 with a message on stderr otherwise, 2 on a usage error.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/cat.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/file.h"
#include "base/json.h"
#include "base/status.h"
#include "base/text_proto.h"
#include "data/batch.h"
#include "data/data.pb.h"
#include "data/data_loader.h"
#include "data/pairs.h"
#include "generation/generate.h"
#include "models/causal_lm.h"
#include "models/hf_checkpoint.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "nlohmann/json.hpp"
#include "objectives/grpo_loss.h"
#include "objectives/metric_means.h"
#include "objectives/objective.h"
#include "objectives/step_items.h"
#include "optim/optimizer.h"
#include "parallel/device_mesh.h"
#include "parallel/test_ranks.h"
#include "sched/schedule_builder.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "wrap/lora/nf4.h"
#include "wrap/lora/peft_adapter.h"
#include "wrap/preparation.h"
#include "wrap/wrap.pb.h"

ABSL_FLAG(std::string, hf_dir, "", "A Hugging Face model folder to read (or, for save_hf, write).");
ABSL_FLAG(std::string, config, "", "save_hf: the config.json of the model to initialise.");
ABSL_FLAG(uint64_t, seed, 1, "save_hf: the seed of plait's initialisation.");
ABSL_FLAG(uint64_t, max_shard_bytes, 0, "save_hf: shard the weights into files of this size.");
ABSL_FLAG(
    std::string, batch, "",
    "A safetensors file of int64 input_ids and labels [B, T] (sft_step: several, with commas).");
ABSL_FLAG(std::string, optimizer, "", "train: an optim.OptimizerConfig text proto.");
ABSL_FLAG(std::string, schedule, "", "train: a sched.ScheduleConfig text proto.");
ABSL_FLAG(std::string, configs, "", "A text file of configs, one text proto per line.");
ABSL_FLAG(std::string, params, "", "optimizers: a safetensors file of the initial parameters.");
ABSL_FLAG(std::string, grads, "", "optimizers: a safetensors file of the gradients and lr.");
ABSL_FLAG(std::string, inputs, "", "grpo_loss: a safetensors file of its inputs.");
ABSL_FLAG(std::string, save_dir, "",
          "train: save the trained model here as a Hugging Face folder.");
ABSL_FLAG(std::string, reference_dir, "", "dpo: the reference model's Hugging Face folder.");
ABSL_FLAG(std::string, pairs, "",
          "dpo: a JSONL file of preference pairs (token ids); sft_step: of SFT examples, packed.");
ABSL_FLAG(int64_t, seq_len, 0, "sft_step --pairs: the packed rows' length.");
ABSL_FLAG(std::string, lora, "", "lora: a wrap.LoraConfig text proto.");
ABSL_FLAG(std::string, adapters, "", "lora: a safetensors file of the adapters' values.");
ABSL_FLAG(std::string, peft_dir, "", "lora: a PEFT adapter folder of the adapters' values.");
ABSL_FLAG(std::string, save_peft_dir, "", "lora: save the adapters here as a PEFT folder.");
ABSL_FLAG(std::string, weights, "", "nf4: a safetensors file of the tensors to quantize.");
ABSL_FLAG(std::string, prompts, "", "generate: a JSON file of prompts, lists of token ids.");
ABSL_FLAG(int32_t, max_new_tokens, 0, "generate: the tokens each completion has.");
ABSL_FLAG(std::string, out, "", "Where to write the results.");

namespace plait::reference {
namespace {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

absl::StatusOr<std::string> RequiredFlag(const absl::Flag<std::string>& flag, const char* name) {
  std::string value = absl::GetFlag(flag);
  if (value.empty()) return absl::InvalidArgumentError(absl::StrCat("--", name, " is required"));
  return value;
}

struct Batch {
  at::Tensor input_ids;  // [B, T]
  at::Tensor targets;    // [B, T]: labels shifted left by one, the last position ignored
};

absl::StatusOr<Batch> ReadBatch(const std::string& path) {
  PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<models::SafetensorsFile> file,
                         models::SafetensorsFile::Open(path));
  Batch batch;
  PLAIT_ASSIGN_OR_RETURN(batch.input_ids, file->Read("input_ids"));
  PLAIT_ASSIGN_OR_RETURN(at::Tensor labels, file->Read("labels"));
  if (batch.input_ids.dim() != 2 || !labels.sizes().equals(batch.input_ids.sizes())) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": input_ids and labels must both be [B, T]"));
  }
  // Hugging Face's causal-LM loss predicts labels[:, t + 1] at position t; CausalLM::Loss
  // takes the targets of each position.
  const int64_t length = labels.size(1);
  batch.targets =
      at::cat({labels.narrow(1, 1, length - 1),
               torch::full({labels.size(0), 1}, models::kIgnoreIndex, labels.options())},
              /*dim=*/1);
  return batch;
}

// The logits, the loss and every trainable parameter's gradient of `model` on `batch`.
NamedTensors ForwardBackward(models::CausalLM& model, const Batch& batch) {
  NamedTensors results;
  {
    at::NoGradGuard no_grad;
    results.emplace_back("logits", model.Forward(batch.input_ids));
  }
  model.zero_grad(/*set_to_none=*/true);
  at::Tensor loss = model.Loss(batch.input_ids, batch.targets);
  // A mixture of experts' loss adds its load-balancing loss, over this one process's batch.
  if (const auto& routing = model.LastRouting()) {
    const at::Tensor aux = routing->Loss(routing->Load(), /*gradient_scale=*/1.0);
    loss = loss + routing->coefficient() * aux;
    results.emplace_back("aux_loss", aux.reshape({1}));
  }
  loss.backward();
  results.emplace_back("loss", loss.detach().reshape({1}));
  for (const auto& parameter : model.NamedParameters()) {
    if (!parameter.parameter.requires_grad()) continue;  // frozen
    results.emplace_back(absl::StrCat("grad.", parameter.name), parameter.parameter.grad());
  }
  return results;
}

absl::Status RunForwardBackward() {
  PLAIT_ASSIGN_OR_RETURN(const std::string hf_dir, RequiredFlag(FLAGS_hf_dir, "hf_dir"));
  PLAIT_ASSIGN_OR_RETURN(const std::string batch_path, RequiredFlag(FLAGS_batch, "batch"));
  PLAIT_ASSIGN_OR_RETURN(const std::string out, RequiredFlag(FLAGS_out, "out"));
  PLAIT_ASSIGN_OR_RETURN(std::shared_ptr<models::CausalLM> model, models::LoadHfModel(hf_dir));
  PLAIT_ASSIGN_OR_RETURN(const Batch batch, ReadBatch(batch_path));
  return models::WriteSafetensors(out, ForwardBackward(*model, batch));
}

absl::Status RunSaveHf() {
  PLAIT_ASSIGN_OR_RETURN(const std::string config_path, RequiredFlag(FLAGS_config, "config"));
  PLAIT_ASSIGN_OR_RETURN(const std::string hf_dir, RequiredFlag(FLAGS_hf_dir, "hf_dir"));
  PLAIT_ASSIGN_OR_RETURN(const std::string batch_path, RequiredFlag(FLAGS_batch, "batch"));
  PLAIT_ASSIGN_OR_RETURN(const std::string out, RequiredFlag(FLAGS_out, "out"));
  PLAIT_ASSIGN_OR_RETURN(const models::ModelConfig config, models::ReadHfConfig(config_path));
  models::InitConfig init;
  init.set_seed(absl::GetFlag(FLAGS_seed));
  // As large as the Python side's weights (harness.py), so that attention is far from
  // uniform and a wrong rotary embedding shows.
  init.set_std(0.15);
  PLAIT_ASSIGN_OR_RETURN(std::shared_ptr<models::CausalLM> model,
                         models::CausalLM::Create(config, init));
  // The initialisation makes biases zero and norm weights one; the export of those must be
  // checked with values that tell the tensors apart.
  {
    at::NoGradGuard no_grad;
    at::manual_seed(absl::GetFlag(FLAGS_seed));
    for (const auto& parameter : model->NamedParameters()) {
      if (parameter.parameter.dim() == 1) {
        parameter.parameter.add_(torch::randn_like(parameter.parameter), /*alpha=*/0.1);
      }
    }
  }
  PLAIT_RETURN_IF_ERROR(
      models::SaveHfModel(*model, hf_dir, at::kFloat, absl::GetFlag(FLAGS_max_shard_bytes)));
  PLAIT_ASSIGN_OR_RETURN(const Batch batch, ReadBatch(batch_path));
  return models::WriteSafetensors(out, ForwardBackward(*model, batch));
}

template <typename Message>
absl::StatusOr<Message> ParseFlagProto(const absl::Flag<std::string>& flag, const char* name) {
  PLAIT_ASSIGN_OR_RETURN(const std::string text, RequiredFlag(flag, name));
  Message message;
  PLAIT_RETURN_IF_ERROR(base::ParseTextProto(text, absl::StrCat("--", name), message));
  return message;
}

absl::Status RunTrain() {
  PLAIT_ASSIGN_OR_RETURN(const std::string hf_dir, RequiredFlag(FLAGS_hf_dir, "hf_dir"));
  PLAIT_ASSIGN_OR_RETURN(const std::string batch_path, RequiredFlag(FLAGS_batch, "batch"));
  PLAIT_ASSIGN_OR_RETURN(const std::string out, RequiredFlag(FLAGS_out, "out"));
  PLAIT_ASSIGN_OR_RETURN(const auto optimizer_config,
                         ParseFlagProto<optim::OptimizerConfig>(FLAGS_optimizer, "optimizer"));
  PLAIT_ASSIGN_OR_RETURN(const auto schedule_config,
                         ParseFlagProto<sched::ScheduleConfig>(FLAGS_schedule, "schedule"));
  PLAIT_ASSIGN_OR_RETURN(const sched::Schedule schedule,
                         sched::BuildSchedule(schedule_config, "--schedule"));
  PLAIT_ASSIGN_OR_RETURN(std::shared_ptr<models::CausalLM> model, models::LoadHfModel(hf_dir));
  PLAIT_ASSIGN_OR_RETURN(const Batch batch, ReadBatch(batch_path));
  std::vector<parallel::TrainableParameter> trainable;
  for (const auto& parameter : model->NamedParameters()) {
    trainable.push_back({parameter.name, parameter.parameter, {}});
  }
  PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<optim::Optimizer> optimizer,
                         optim::Optimizer::Create(trainable, optimizer_config));
  const int64_t steps = schedule_config.total_steps();
  at::Tensor losses = torch::empty({steps});
  for (int64_t step = 0; step < steps; ++step) {
    optimizer->ZeroGrad();
    at::Tensor loss = model->Loss(batch.input_ids, batch.targets);
    loss.backward();
    losses[step] = loss.detach();
    PLAIT_RETURN_IF_ERROR(optimizer->Step(schedule.LearningRate(step)).status());
  }
  NamedTensors results = {{"loss", losses}};
  for (const auto& parameter : model->NamedParameters()) {
    results.emplace_back(absl::StrCat("param.", parameter.name), parameter.parameter.detach());
  }
  if (const std::string save_dir = absl::GetFlag(FLAGS_save_dir); !save_dir.empty()) {
    PLAIT_RETURN_IF_ERROR(models::SaveHfModel(*model, save_dir));
  }
  return models::WriteSafetensors(out, results);
}

// The messages of the file --configs names, one text proto per line.
template <typename Message>
absl::StatusOr<std::vector<Message>> ReadConfigs() {
  PLAIT_ASSIGN_OR_RETURN(const std::string path, RequiredFlag(FLAGS_configs, "configs"));
  PLAIT_ASSIGN_OR_RETURN(const std::string text, base::ReadFile(path));
  std::vector<Message> messages;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    Message& message = messages.emplace_back();
    PLAIT_RETURN_IF_ERROR(
        base::ParseTextProto(line, absl::StrCat(path, ":", messages.size()), message));
  }
  return messages;
}

absl::Status RunSchedules() {
  PLAIT_ASSIGN_OR_RETURN(const std::string out, RequiredFlag(FLAGS_out, "out"));
  PLAIT_ASSIGN_OR_RETURN(const auto configs, ReadConfigs<sched::ScheduleConfig>());
  std::string text;
  for (size_t i = 0; i < configs.size(); ++i) {
    PLAIT_ASSIGN_OR_RETURN(const sched::Schedule schedule,
                           sched::BuildSchedule(configs[i], absl::StrCat("configs[", i, "]")));
    for (int64_t step = 0; step <= configs[i].total_steps(); ++step) {
      char value[32];
      std::snprintf(value, sizeof(value), "%.17g ", schedule.LearningRate(step));
      text += value;
    }
    text += "\n";
  }
  return base::WriteFileAtomically(out, text);
}

absl::Status RunOptimizers() {
  PLAIT_ASSIGN_OR_RETURN(const std::string params_path, RequiredFlag(FLAGS_params, "params"));
  PLAIT_ASSIGN_OR_RETURN(const std::string grads_path, RequiredFlag(FLAGS_grads, "grads"));
  PLAIT_ASSIGN_OR_RETURN(const std::string out, RequiredFlag(FLAGS_out, "out"));
  PLAIT_ASSIGN_OR_RETURN(const auto configs, ReadConfigs<optim::OptimizerConfig>());
  PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<models::SafetensorsFile> params,
                         models::SafetensorsFile::Open(params_path));
  PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<models::SafetensorsFile> grads,
                         models::SafetensorsFile::Open(grads_path));
  PLAIT_ASSIGN_OR_RETURN(const at::Tensor lrs, grads->Read("lr"));
  const int64_t steps = lrs.size(0);
  NamedTensors results;
  for (size_t c = 0; c < configs.size(); ++c) {
    std::vector<parallel::TrainableParameter> trainable;
    std::vector<at::Tensor> gradients;   // [steps, ...] per parameter
    std::vector<at::Tensor> trajectory;  // [steps, ...] per parameter
    for (const auto& [name, entry] : params->entries()) {
      PLAIT_ASSIGN_OR_RETURN(at::Tensor tensor, params->Read(name));
      PLAIT_ASSIGN_OR_RETURN(at::Tensor gradient, grads->Read(name));
      trainable.push_back({name, tensor, {}});
      gradients.push_back(gradient);
      std::vector<int64_t> shape = {steps};
      shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
      trajectory.push_back(torch::empty(shape));
    }
    PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<optim::Optimizer> optimizer,
                           base::Annotate(optim::Optimizer::Create(trainable, configs[c]),
                                          absl::StrCat("configs[", c, "]")));
    for (int64_t step = 0; step < steps; ++step) {
      for (size_t i = 0; i < trainable.size(); ++i) {
        trainable[i].tensor.mutable_grad() = gradients[i][step].clone();
      }
      PLAIT_RETURN_IF_ERROR(optimizer->Step(lrs[step].item<double>()).status());
      for (size_t i = 0; i < trainable.size(); ++i) trajectory[i][step] = trainable[i].tensor;
    }
    for (size_t i = 0; i < trainable.size(); ++i) {
      results.emplace_back(absl::StrCat(c, ".", trainable[i].name), trajectory[i]);
    }
  }
  return models::WriteSafetensors(out, results);
}

// Runs `body` on a one-rank mesh with `model` prepared by `steps`, giving it the parameters
// that train; the preparation's hooks (LoRA's adapters) live while it runs.
absl::Status OnOneRankPrepared(
    models::CausalLM& model, const std::vector<wrap::PrepareStep>& steps,
    const std::function<absl::Status(const std::vector<parallel::TrainableParameter>&)>& body) {
  PLAIT_ASSIGN_OR_RETURN(const parallel::MeshLayout one_rank,
                         parallel::MeshLayout::Create(parallel::MeshConfig(), 1));
  absl::Status status;
  parallel::testing::RunOnRingMesh(one_rank, [&](int, parallel::DeviceMesh& mesh) {
    status = [&]() -> absl::Status {
      PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<wrap::Preparation> preparation,
                             wrap::Preparation::Begin(model, mesh));
      for (const wrap::PrepareStep& step : steps) PLAIT_RETURN_IF_ERROR(preparation->Apply(step));
      PLAIT_ASSIGN_OR_RETURN(const std::vector<parallel::TrainableParameter> trainable,
                             preparation->TakeTrainableParameters());
      return body(trainable);
    }();
  });
  return status;
}

absl::Status RunDpo() {
  PLAIT_ASSIGN_OR_RETURN(const std::string policy_dir, RequiredFlag(FLAGS_hf_dir, "hf_dir"));
  const std::string reference_dir = absl::GetFlag(FLAGS_reference_dir);
  const std::string peft_dir = absl::GetFlag(FLAGS_peft_dir);
  if (reference_dir.empty() == peft_dir.empty()) {
    return absl::InvalidArgumentError("dpo: give one of --reference_dir and --peft_dir");
  }
  PLAIT_ASSIGN_OR_RETURN(const std::string pairs_path, RequiredFlag(FLAGS_pairs, "pairs"));
  PLAIT_ASSIGN_OR_RETURN(const std::string out, RequiredFlag(FLAGS_out, "out"));
  PLAIT_ASSIGN_OR_RETURN(const auto configs, ReadConfigs<objectives::ObjectiveConfig>());
  PLAIT_ASSIGN_OR_RETURN(std::shared_ptr<models::CausalLM> policy, models::LoadHfModel(policy_dir));
  std::shared_ptr<models::CausalLM> reference;
  std::vector<wrap::PrepareStep> adapters;
  if (!reference_dir.empty()) {
    PLAIT_ASSIGN_OR_RETURN(reference, models::LoadHfModel(reference_dir));
  } else {
    PLAIT_ASSIGN_OR_RETURN(*adapters.emplace_back().mutable_lora(),
                           ParseFlagProto<wrap::LoraConfig>(FLAGS_lora, "lora"));
    adapters.back().mutable_lora()->set_initial_adapter_dir(peft_dir);
  }
  // Long enough for every pair, so nothing is cut: the batch is padded to the longest.
  const int64_t seq_len = policy->config().max_position_embeddings();
  const data::PairFiles files;
  PLAIT_ASSIGN_OR_RETURN(const data::PairExamples pairs,
                         data::ReadPairFile(pairs_path, data::PairKind::kPreference, files,
                                            policy->config().vocab_size(), seq_len));
  std::vector<const data::PairExample*> examples;
  int64_t longest = 0;
  for (const data::PairExample& pair : pairs.examples) {
    examples.push_back(&pair);
    longest =
        std::max(longest, static_cast<int64_t>(pair.prompt.size() +
                                               std::max(pair.chosen.size(), pair.rejected.size())));
  }
  const data::Batch batch = data::PairRows(examples, data::PairKind::kPreference, files, longest);
  return OnOneRankPrepared(
      *policy, adapters,
      [&](const std::vector<parallel::TrainableParameter>& trainable) -> absl::Status {
        NamedTensors results;
        for (size_t c = 0; c < configs.size(); ++c) {
          std::map<std::string, models::CausalLM*> references;
          if (reference != nullptr) references[configs[c].dpo().reference()] = reference.get();
          PLAIT_ASSIGN_OR_RETURN(
              std::unique_ptr<objectives::Objective> objective,
              objectives::MakeObjective(configs[c], references, absl::StrCat("configs[", c, "]")));
          policy->zero_grad(/*set_to_none=*/true);
          PLAIT_ASSIGN_OR_RETURN(const objectives::ObjectiveOutput output,
                                 objective->Compute(*policy, batch));
          output.loss.backward();
          results.emplace_back(absl::StrCat(c, ".loss"), output.loss.detach().reshape({1}));
          for (const auto& [name, value] : output.metrics) {
            results.emplace_back(absl::StrCat(c, ".", name), value.reshape({1}));
          }
          for (const parallel::TrainableParameter& parameter : trainable) {
            results.emplace_back(absl::StrCat(c, ".grad.", parameter.name),
                                 parameter.tensor.grad().clone());
          }
        }
        return models::WriteSafetensors(out, results);
      });
}

// All the SFT examples of the JSONL file `path` (token ids) in one micro-batch of rows of
// `seq_len` tokens packed by best-fit decreasing, as a one-rank DataLoader reads them.
absl::StatusOr<data::Batch> PackedSftBatch(const std::string& path, int64_t seq_len,
                                           int64_t vocab_size) {
  data::DataConfig config;
  data::PairFiles& files = *config.mutable_sft_files();
  files.set_train_path(path);
  files.set_packing(data::PACKING_BFD);
  const auto loader = [&](int64_t rows) {
    return data::DataLoader::Create(config, data::Split::kTrain, vocab_size, rows, seq_len, 0, 1,
                                    "pairs");
  };
  PLAIT_ASSIGN_OR_RETURN(const data::DataLoader counted, loader(1));
  PLAIT_ASSIGN_OR_RETURN(data::DataLoader all, loader(counted.Packing()->bfd_rows));
  return all.Next();
}

absl::Status RunSftStep() {
  PLAIT_ASSIGN_OR_RETURN(const std::string hf_dir, RequiredFlag(FLAGS_hf_dir, "hf_dir"));
  PLAIT_ASSIGN_OR_RETURN(const std::string out, RequiredFlag(FLAGS_out, "out"));
  PLAIT_ASSIGN_OR_RETURN(std::shared_ptr<models::CausalLM> model, models::LoadHfModel(hf_dir));
  objectives::ObjectiveConfig config;
  config.mutable_sft();
  PLAIT_ASSIGN_OR_RETURN(const std::unique_ptr<objectives::Objective> objective,
                         objectives::MakeObjective(config, {}, "sft"));
  std::vector<data::Batch> batches;
  NamedTensors results;
  if (const std::string pairs = absl::GetFlag(FLAGS_pairs); !pairs.empty()) {
    PLAIT_ASSIGN_OR_RETURN(data::Batch packed, PackedSftBatch(pairs, absl::GetFlag(FLAGS_seq_len),
                                                              model->config().vocab_size()));
    results = {
        {"inputs", packed.inputs}, {"targets", packed.targets}, {"positions", packed.positions}};
    batches.push_back(std::move(packed));
  } else {
    PLAIT_ASSIGN_OR_RETURN(const std::string batch_paths, RequiredFlag(FLAGS_batch, "batch"));
    for (absl::string_view path : absl::StrSplit(batch_paths, ',')) {
      PLAIT_ASSIGN_OR_RETURN(const Batch batch, ReadBatch(std::string(path)));
      batches.push_back({batch.input_ids, batch.targets});
    }
  }
  std::vector<int64_t> items;
  for (const data::Batch& batch : batches) items.push_back(objective->ScoredItems(batch));
  PLAIT_ASSIGN_OR_RETURN(const parallel::MeshLayout one_rank,
                         parallel::MeshLayout::Create(parallel::MeshConfig(), 1));
  absl::StatusOr<objectives::MeanMetrics> step_loss;
  parallel::testing::RunOnRingMesh(one_rank, [&](int, parallel::DeviceMesh& mesh) {
    step_loss = [&]() -> absl::StatusOr<objectives::MeanMetrics> {
      PLAIT_ASSIGN_OR_RETURN(const objectives::StepItems step,
                             objectives::StepItems::Count(items, mesh, {}));
      objectives::MetricMeans means;
      for (size_t micro = 0; micro < batches.size(); ++micro) {
        PLAIT_ASSIGN_OR_RETURN(const objectives::ObjectiveOutput output,
                               objective->Compute(*model, batches[micro]));
        step.ScaledForBackward(output.loss, static_cast<int>(micro)).backward();
        means.Add(output, items[micro]);
      }
      return means.Mean(mesh);
    }();
  });
  PLAIT_RETURN_IF_ERROR(step_loss.status());
  results.emplace_back("loss", torch::tensor({static_cast<float>(step_loss->loss)}));
  for (const auto& parameter : model->NamedParameters()) {
    results.emplace_back(absl::StrCat("grad.", parameter.name), parameter.parameter.grad());
  }
  return models::WriteSafetensors(out, results);
}

absl::Status RunLora() {
  PLAIT_ASSIGN_OR_RETURN(const std::string hf_dir, RequiredFlag(FLAGS_hf_dir, "hf_dir"));
  PLAIT_ASSIGN_OR_RETURN(const std::string batch_path, RequiredFlag(FLAGS_batch, "batch"));
  PLAIT_ASSIGN_OR_RETURN(const std::string out, RequiredFlag(FLAGS_out, "out"));
  const std::string adapters_path = absl::GetFlag(FLAGS_adapters);
  const std::string peft_dir = absl::GetFlag(FLAGS_peft_dir);
  if (adapters_path.empty() == peft_dir.empty()) {
    return absl::InvalidArgumentError("lora: give one of --adapters and --peft_dir");
  }
  wrap::PrepareStep step;
  PLAIT_ASSIGN_OR_RETURN(*step.mutable_lora(),
                         ParseFlagProto<wrap::LoraConfig>(FLAGS_lora, "lora"));
  PLAIT_ASSIGN_OR_RETURN(std::shared_ptr<models::CausalLM> model, models::LoadHfModel(hf_dir));
  PLAIT_ASSIGN_OR_RETURN(const Batch batch, ReadBatch(batch_path));
  // The adapters' values by plait's names, from --adapters; a PEFT folder is the step's own
  // start (LoraConfig.initial_adapter_dir).
  std::map<std::string, at::Tensor> values;
  if (!peft_dir.empty()) {
    step.mutable_lora()->set_initial_adapter_dir(peft_dir);
  } else {
    PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<models::SafetensorsFile> file,
                           models::SafetensorsFile::Open(adapters_path));
    for (const auto& entry : file->entries()) {
      PLAIT_ASSIGN_OR_RETURN(values[entry.first], file->Read(entry.first));
    }
  }
  return OnOneRankPrepared(
      *model, {step},
      [&](const std::vector<parallel::TrainableParameter>& trainable) -> absl::Status {
        NamedTensors results;
        at::NoGradGuard no_grad;
        for (const parallel::TrainableParameter& parameter : trainable) {
          results.emplace_back(absl::StrCat("init.", parameter.name), parameter.tensor.clone());
          if (!peft_dir.empty()) continue;
          const auto value = values.find(parameter.name);
          if (value == values.end()) {
            return absl::NotFoundError(absl::StrCat("the adapters have no ", parameter.name));
          }
          if (!value->second.sizes().equals(parameter.tensor.sizes())) {
            return absl::InvalidArgumentError(
                absl::StrCat(parameter.name, " is ", c10::str(value->second.sizes()),
                             ", plait's adapter ", c10::str(parameter.tensor.sizes())));
          }
          parameter.tensor.copy_(value->second);
        }
        if (const std::string save_dir = absl::GetFlag(FLAGS_save_peft_dir); !save_dir.empty()) {
          std::vector<std::pair<std::string, at::Tensor>> adapters;
          for (const parallel::TrainableParameter& parameter : trainable) {
            adapters.emplace_back(parameter.name, parameter.tensor);
          }
          std::filesystem::create_directories(save_dir);
          PLAIT_RETURN_IF_ERROR(
              wrap::lora::SavePeftAdapter(save_dir, step.lora(), adapters, hf_dir));
        }
        at::AutoGradMode grad_mode(true);
        for (auto& result : ForwardBackward(*model, batch)) results.push_back(std::move(result));
        return models::WriteSafetensors(out, results);
      });
}

absl::Status RunNf4() {
  PLAIT_ASSIGN_OR_RETURN(const std::string weights, RequiredFlag(FLAGS_weights, "weights"));
  PLAIT_ASSIGN_OR_RETURN(const std::string out, RequiredFlag(FLAGS_out, "out"));
  PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<models::SafetensorsFile> file,
                         models::SafetensorsFile::Open(weights));
  NamedTensors results;
  for (const auto& entry : file->entries()) {
    PLAIT_ASSIGN_OR_RETURN(const at::Tensor weight, file->Read(entry.first));
    for (const bool double_quant : {false, true}) {
      const wrap::lora::Nf4Tensor q = wrap::lora::Nf4Quantize(weight, double_quant);
      const std::string prefix = absl::StrCat(entry.first, double_quant ? ".nf4dq." : ".nf4.");
      results.emplace_back(prefix + "packed", q.packed.to(at::kLong));
      if (double_quant) {
        results.emplace_back(prefix + "absmax_codes", q.absmax_codes.to(at::kLong));
        results.emplace_back(prefix + "absmax_scales", q.absmax_scales);
        results.emplace_back(prefix + "absmax_offset", q.absmax_offset.reshape({1}));
      } else {
        results.emplace_back(prefix + "absmax", q.absmax);
      }
      results.emplace_back(prefix + "dequantized",
                           wrap::lora::Nf4Dequantize(q, weight.scalar_type()));
    }
  }
  return models::WriteSafetensors(out, results);
}

absl::Status RunGenerate() {
  PLAIT_ASSIGN_OR_RETURN(const std::string hf_dir, RequiredFlag(FLAGS_hf_dir, "hf_dir"));
  PLAIT_ASSIGN_OR_RETURN(const std::string prompts_path, RequiredFlag(FLAGS_prompts, "prompts"));
  PLAIT_ASSIGN_OR_RETURN(const std::string out, RequiredFlag(FLAGS_out, "out"));
  PLAIT_ASSIGN_OR_RETURN(std::shared_ptr<models::CausalLM> model, models::LoadHfModel(hf_dir));
  PLAIT_ASSIGN_OR_RETURN(const std::string text, base::ReadFile(prompts_path));
  PLAIT_ASSIGN_OR_RETURN(const nlohmann::json json, base::ParseJson(prompts_path, text));
  const auto prompts = json.get<std::vector<std::vector<int64_t>>>();
  generation::SamplingConfig config;
  config.set_max_new_tokens(absl::GetFlag(FLAGS_max_new_tokens));
  PLAIT_ASSIGN_OR_RETURN(const std::vector<generation::Completion> completions,
                         generation::Generate(*model, prompts, config));
  nlohmann::json results = nlohmann::json::array();
  for (const generation::Completion& completion : completions) {
    results.push_back({{"tokens", completion.tokens}, {"logprobs", completion.logprobs}});
  }
  return base::WriteFileAtomically(out, results.dump());
}

absl::Status RunGrpoLoss() {
  PLAIT_ASSIGN_OR_RETURN(const std::string inputs_path, RequiredFlag(FLAGS_inputs, "inputs"));
  PLAIT_ASSIGN_OR_RETURN(const std::string out, RequiredFlag(FLAGS_out, "out"));
  PLAIT_ASSIGN_OR_RETURN(const auto configs, ReadConfigs<objectives::Grpo>());
  PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<models::SafetensorsFile> inputs,
                         models::SafetensorsFile::Open(inputs_path));
  std::map<std::string, at::Tensor> read;
  for (const char* name : {"logps", "old_logps", "ref_logps", "mask", "rewards"}) {
    PLAIT_ASSIGN_OR_RETURN(read[name], inputs->Read(name));
  }
  NamedTensors results;
  for (size_t c = 0; c < configs.size(); ++c) {
    const at::Tensor advantages = objectives::GroupAdvantages(configs[c], read["rewards"]);
    const at::Tensor logps = read["logps"].clone().requires_grad_(true);
    const objectives::GrpoTerms terms =
        objectives::GrpoLoss(configs[c], {.logps = logps,
                                          .old_logps = read["old_logps"],
                                          .ref_logps = read["ref_logps"],
                                          .advantages = advantages,
                                          .mask = read["mask"]});
    terms.loss.backward();
    const auto mean = [&](double sum) { return torch::tensor({sum / terms.tokens}); };
    for (auto& [name, tensor] : std::vector<std::pair<std::string, at::Tensor>>{
             {"advantages", advantages},
             {"loss", terms.loss.detach().reshape({1})},
             {"grad", logps.grad()},
             {"kl", mean(terms.kl)},
             {"clip_ratio/low_mean", mean(terms.low_clipped)},
             {"clip_ratio/high_mean", mean(terms.high_clipped)}}) {
      results.emplace_back(absl::StrCat(c, ".", name), tensor.contiguous());
    }
  }
  return models::WriteSafetensors(out, results);
}

}  // namespace
}  // namespace plait::reference

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "plait's side of the reference tests; see tests/reference/plait_reference.cc.\n"
      "usage: plait_reference "
      "forward_backward|save_hf|train|schedules|optimizers|dpo|sft_step|lora|nf4|generate|"
      "grpo_loss "
      "--flags...");
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() != 2) {
    std::cerr << "plait_reference: give one command: forward_backward, save_hf, train, "
                 "schedules, optimizers, dpo, sft_step, lora, nf4, generate or grpo_loss\n";
    return 2;
  }
  const std::string command = positional[1];
  absl::Status status;
  if (command == "forward_backward") {
    status = plait::reference::RunForwardBackward();
  } else if (command == "save_hf") {
    status = plait::reference::RunSaveHf();
  } else if (command == "train") {
    status = plait::reference::RunTrain();
  } else if (command == "schedules") {
    status = plait::reference::RunSchedules();
  } else if (command == "optimizers") {
    status = plait::reference::RunOptimizers();
  } else if (command == "dpo") {
    status = plait::reference::RunDpo();
  } else if (command == "sft_step") {
    status = plait::reference::RunSftStep();
  } else if (command == "lora") {
    status = plait::reference::RunLora();
  } else if (command == "nf4") {
    status = plait::reference::RunNf4();
  } else if (command == "generate") {
    status = plait::reference::RunGenerate();
  } else if (command == "grpo_loss") {
    status = plait::reference::RunGrpoLoss();
  } else {
    std::cerr << "plait_reference: unknown command \"" << command << "\"\n";
    return 2;
  }
  if (!status.ok()) {
    std::cerr << "plait_reference " << command << ": " << status.message() << "\n";
    return 1;
  }
  return 0;
}
