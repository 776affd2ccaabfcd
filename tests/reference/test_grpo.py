"""plait's GRPO arithmetic (objectives/grpo_loss.h) against TRL's
GRPOTrainer (the version tools/setup.sh installs, 1.16): each completion's
advantage within its group, and the loss, its gradient in the policy's
per-token log-probabilities and the logged KL and clip ratios of one
micro-batch, for each loss type plait has, beta 0 and 0.04, one update a
generation (num_iterations 1: the old log-probabilities are the policy's own)
and a second update on the same completions (num_iterations 2: they differ).

TRL's loss is its own code: GRPOTrainer._compute_loss, called on a stand-in
for the trainer whose per-token log-probabilities are the fixed tensor below
(as its model would compute them), one process, no gradient accumulation.
Its advantages are computed in _generate_and_score_completions, inline with
the generation; the test repeats those lines (sum_then_normalize, TRL's
default) with TRL's own nanstd.
"""

import collections
import types

import pytest
import torch
import trl
from trl.trainer.grpo_trainer import GRPOTrainer
from trl.trainer.utils import nanstd

import harness

GENERATIONS = 4
MAX_COMPLETION_LENGTH = 7

# Each case: plait's objectives.Grpo fields and TRL's GRPOConfig fields.
CASES = {
    "dapo": ("", {}),
    "grpo": ("loss_type: GRPO_LOSS_GRPO", dict(loss_type="grpo")),
    "bnpo": ("loss_type: GRPO_LOSS_BNPO", dict(loss_type="bnpo")),
    "dr_grpo": ("loss_type: GRPO_LOSS_DR_GRPO", dict(loss_type="dr_grpo")),
    "dapo_clip_higher_beta": ("epsilon_high: 0.28 beta: 0.04",
                              dict(epsilon_high=0.28, beta=0.04)),
    "grpo_beta_batch_scale": (
        "loss_type: GRPO_LOSS_GRPO beta: 0.04 scale_rewards: "
        "GRPO_REWARD_SCALE_BATCH",
        dict(loss_type="grpo", beta=0.04, scale_rewards="batch")),
    "bnpo_unscaled": ("loss_type: GRPO_LOSS_BNPO scale_rewards: "
                      "GRPO_REWARD_SCALE_NONE",
                      dict(loss_type="bnpo", scale_rewards="none")),
    "dr_grpo_beta": ("loss_type: GRPO_LOSS_DR_GRPO beta: 0.04",
                     dict(loss_type="dr_grpo", beta=0.04)),
    "bnpo_beta_kl_without_ratio": (
        "loss_type: GRPO_LOSS_BNPO beta: 0.04 kl_without_ratio: true",
        dict(loss_type="bnpo", beta=0.04, use_bias_correction_kl=False)),
}


def completions(second_update):
    """Two prompts' groups of completions of different lengths: per-token
    log-probabilities under the policy, at generation (the same, or, for a
    second update, the policy's before the first), under the reference,
    the completion mask and a reward each."""
    generator = torch.Generator().manual_seed(5)
    count = 2 * GENERATIONS
    lengths = torch.tensor([7, 3, 5, 1, 6, 6, 2, 4])
    mask = (torch.arange(MAX_COMPLETION_LENGTH)[None, :] <
            lengths[:, None]).float()
    logps = -torch.rand(count, MAX_COMPLETION_LENGTH, generator=generator) * 3
    shift = torch.randn(count, MAX_COMPLETION_LENGTH, generator=generator)
    # Ratios up to about e^0.5: some tokens leave [0.8, 1.28].
    old = logps - 0.25 * shift if second_update else logps.clone()
    reference = logps + 0.3 * torch.randn(count, MAX_COMPLETION_LENGTH,
                                          generator=generator)
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.0, 0.25, 1.0])
    return dict(logps=logps, old_logps=old, ref_logps=reference, mask=mask,
                rewards=rewards)


def trl_advantages(rewards, scale):
    """_generate_and_score_completions' advantages (sum_then_normalize)."""
    mean = torch.nanmean(rewards.view(-1, GENERATIONS), dim=1)
    mean = mean.repeat_interleave(GENERATIONS, dim=0)
    if scale == "batch":
        std = nanstd(rewards).expand_as(rewards)
    else:
        std = nanstd(rewards.view(-1, GENERATIONS), dim=1)
        std = std.repeat_interleave(GENERATIONS, dim=0)
    advantages = rewards - mean
    if scale != "none":
        advantages = advantages / (std + 1e-4)
    return advantages


class Accelerator:
    """One process: collectives are the tensors themselves."""
    num_processes = 1

    def reduce(self, tensor, reduction="sum"):
        return tensor

    def gather(self, tensor):
        return tensor

    gather_for_metrics = gather


def trl_loss(inputs, config, second_update):
    """GRPOTrainer._compute_loss on a stand-in trainer: the loss, its
    gradient in logps, and the metrics it logs."""
    args = trl.GRPOConfig(output_dir="unused", report_to=[], use_cpu=True,
                          num_generations=GENERATIONS,
                          max_completion_length=MAX_COMPLETION_LENGTH,
                          **config)
    logps = inputs["logps"].clone().requires_grad_(True)
    count = logps.size(0)
    trainer = types.SimpleNamespace(
        args=args, beta=args.beta, loss_type=args.loss_type,
        epsilon_low=args.epsilon,
        epsilon_high=(args.epsilon_high if args.epsilon_high is not None
                      else args.epsilon),
        importance_sampling_level=args.importance_sampling_level,
        top_entropy_quantile=args.top_entropy_quantile,
        off_policy_mask_threshold=None, use_vllm=False,
        aux_loss_enabled=False, _entropy_bonus_enabled=False,
        current_gradient_accumulation_steps=1,
        max_completion_length=MAX_COMPLETION_LENGTH,
        accelerator=Accelerator(), model=types.SimpleNamespace(training=True),
        _metrics=collections.defaultdict(lambda: collections.defaultdict(list)))
    args.steps_per_generation = 1
    trainer._get_per_token_logps_and_entropies = (
        lambda *a, **k: (logps, torch.zeros_like(logps), None))
    batch = dict(
        prompt_ids=torch.zeros(count, 1, dtype=torch.long),
        prompt_mask=torch.ones(count, 1, dtype=torch.long),
        completion_ids=torch.zeros(count, MAX_COMPLETION_LENGTH,
                                   dtype=torch.long),
        completion_mask=inputs["mask"],
        advantages=trl_advantages(inputs["rewards"],
                                  args.scale_rewards),
        num_items_in_batch=inputs["mask"].sum())
    if second_update:
        batch["old_per_token_logps"] = inputs["old_logps"]
    if args.beta != 0.0:
        batch["ref_per_token_logps"] = inputs["ref_logps"]
    loss = GRPOTrainer._compute_loss(trainer, None, batch)
    loss.backward()
    metrics = {name: torch.tensor([values[-1]])
               for name, values in trainer._metrics["train"].items()}
    return dict(advantages=batch["advantages"], loss=loss.detach().view(1),
                grad=logps.grad, **metrics)


@pytest.mark.parametrize("second_update", [False, True],
                         ids=["num_iterations_1", "num_iterations_2"])
def test_grpo_loss_equals_trl(tmp_path, second_update):
    inputs = completions(second_update)
    harness.save_file(inputs, str(tmp_path / "inputs"))
    names = sorted(CASES)
    (tmp_path / "configs.txt").write_text("".join(
        f"num_generations: {GENERATIONS} max_completion_length: "
        f"{MAX_COMPLETION_LENGTH} {CASES[name][0]}\n" for name in names))
    harness.run_plait("grpo_loss", inputs=tmp_path / "inputs",
                      configs=tmp_path / "configs.txt", out=tmp_path / "plait")
    plait = harness.load_file(str(tmp_path / "plait"))
    clipped = 0.0
    for i, name in enumerate(names):
        expected = trl_loss(inputs, CASES[name][1], second_update)
        for what in ["advantages", "loss", "grad", "clip_ratio/low_mean",
                     "clip_ratio/high_mean"] + (["kl"] if "kl" in expected
                                                else []):
            actual = plait[f"{i}.{what}"]
            if what.startswith("clip_ratio"):
                assert torch.equal(actual, expected[what].float()), (
                    f"{name}: {what} {actual} != {expected[what]}")
                clipped += actual.item()
            else:
                harness.expect_close("grpo", f"{name}: {what}", actual,
                                     expected[what].float())
    # A second update clips some tokens; the first clips none.
    assert (clipped > 0) == second_update
