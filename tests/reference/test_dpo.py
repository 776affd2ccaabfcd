"""plait's DPO objective (objectives/) against TRL's DPOTrainer: the loss,
the reward and log-probability metrics and every gradient of the policy, for
each loss type plait has, on the same models and the same preference pairs;
and DPO of LoRA adapters against the policy with its adapters off, which TRL
computes for a PEFT model given no reference model.

TRL's side is its own trainer: a DPOTrainer built on the policy and the
reference (transformers models from the Hugging Face folders plait reads),
whose data preparation and collator make the batch and whose compute_loss
computes the loss and records the metrics. plait's side reads the pairs that
TRL tokenized, in plait's JSONL format, with its own reader.

TRL 1.x dropped label smoothing from the sigmoid loss (it keeps it for
robust). plait's smoothed sigmoid loss is the conservative DPO loss of the
TRL releases before, (1 - eps) * sigmoid(z) + eps * sigmoid(-z); it is
checked against TRL's sigmoid loss of the pairs and of the same pairs with
chosen and rejected swapped (which negates z), weighted so.
"""

import json

import datasets
import peft
import pytest
import torch
import transformers
import trl

import harness

MODEL = "qwen2_tied"
METRICS = ["rewards/chosen", "rewards/rejected", "rewards/accuracies",
           "rewards/margins", "logps/chosen", "logps/rejected"]

# Each case: plait's objectives.ObjectiveConfig dpo fields (less the
# reference), and TRL's DPOConfig fields. The first leaves beta unset, so
# both sides take their default.
CASES = {
    "sigmoid": ("", {}),
    "sigmoid_label_smoothing": ("beta: 0.2 label_smoothing: 0.1",
                                dict(beta=0.2, label_smoothing=0.1)),
    "ipo": ("beta: 0.5 loss_type: DPO_LOSS_IPO",
            dict(beta=0.5, loss_type=["ipo"])),
    "hinge": ("beta: 0.05 loss_type: DPO_LOSS_HINGE",
              dict(beta=0.05, loss_type=["hinge"])),
    "robust": ("beta: 0.2 loss_type: DPO_LOSS_ROBUST label_smoothing: 0.15",
               dict(beta=0.2, loss_type=["robust"], label_smoothing=0.15)),
}

# Preference pairs of different lengths, as text of harness.tokenizer().
PAIR_LENGTHS = [(3, 4, 6), (5, 2, 3), (1, 7, 5), (4, 3, 3)]


def pair_texts():
    text = harness.random_words(seed=7)
    columns = {"prompt": [], "chosen": [], "rejected": []}
    for lengths in PAIR_LENGTHS:
        for column, length in zip(columns, lengths):
            # TRL tokenizes prompt + completion as one text.
            columns[column].append(
                text(length) if column == "prompt" else " " + text(length))
    return datasets.Dataset.from_dict(columns)


def load_model(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager").float()


def dpo_trainer(policy, reference, out, peft_config=None, **config):
    """TRL's DPOTrainer of the models on pair_texts(), in fp32 throughout:
    DPOConfig's default bf16 would run the reference under bf16 autocast."""
    args = trl.DPOConfig(output_dir=str(out), report_to=[], use_cpu=True,
                         bf16=False, **config)
    return trl.DPOTrainer(model=policy, ref_model=reference, args=args,
                          train_dataset=pair_texts(),
                          processing_class=harness.tokenizer(),
                          peft_config=peft_config)


def trl_trainer(folder, case, out):
    """A DPOTrainer of CASES[case] on fresh copies of the policy and the
    reference in folder."""
    return dpo_trainer(load_model(folder / "policy"),
                       load_model(folder / "reference"), out,
                       **CASES[case][1])


def trl_step(trainer, swap=False):
    """TRL's loss of all the pairs in one batch (chosen and rejected
    swapped if swap), and the metrics it recorded."""
    examples = [dict(example) for example in trainer.train_dataset]
    if swap:
        for example in examples:
            example["chosen_ids"], example["rejected_ids"] = (
                example["rejected_ids"], example["chosen_ids"])
    trainer.model.train()
    trainer._metrics["train"].clear()
    loss = trainer.compute_loss(trainer.model, trainer.data_collator(examples))
    return loss, {name: values[-1]
                  for name, values in trainer._metrics["train"].items()}


def write_pairs(trainer, path):
    """The pairs TRL tokenized, in plait's JSONL format."""
    with open(path, "w") as f:
        for e in trainer.train_dataset:
            f.write(json.dumps({"prompt": e["prompt_ids"],
                                "chosen": e["chosen_ids"],
                                "rejected": e["rejected_ids"]}) + "\n")


def plait_run(results, prefix=""):
    """The loss, metrics and gradients plait_reference's dpo wrote for one
    config."""
    return dict(loss=results[prefix + "loss"],
                metrics={name: results[prefix + name].item()
                         for name in METRICS},
                grads=harness.plait_gradients(results, prefix))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """TRL's and plait's loss, metrics and policy gradients per case."""
    harness.quiet_trl()
    folder = tmp_path_factory.mktemp("dpo")
    # The reference is the policy moved a little, as after a few steps of
    # training, so that the rewards are of a realistic size.
    policy = harness.hf_model(MODEL, seed=0)
    policy.save_pretrained(folder / "policy")
    reference = harness.hf_model(MODEL, seed=0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in reference.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    reference.save_pretrained(folder / "reference")

    expected = {}
    for case in sorted(CASES):
        trainer = trl_trainer(folder, case, folder / f"trl_{case}")
        trainer.model.zero_grad(set_to_none=True)
        loss, metrics = trl_step(trainer)
        smoothing = CASES[case][1].get("label_smoothing", 0.0)
        if case.startswith("sigmoid") and smoothing > 0:
            swapped_loss, _ = trl_step(trainer, swap=True)
            loss = (1 - smoothing) * loss + smoothing * swapped_loss
        loss.backward()
        expected[case] = dict(
            loss=loss.detach().reshape(1), metrics=metrics, beta=trainer.beta,
            grads={name: p.grad.clone()
                   for name, p in trainer.model.named_parameters()})
        write_pairs(trainer, folder / "pairs.jsonl")

    with open(folder / "configs.txt", "w") as f:
        for case in sorted(CASES):
            f.write(f'dpo {{ reference: "ref" {CASES[case][0]} }}\n')
    harness.run_plait("dpo", hf_dir=folder / "policy",
                      reference_dir=folder / "reference",
                      pairs=folder / "pairs.jsonl",
                      configs=folder / "configs.txt", out=folder / "plait")
    plait = harness.load_file(str(folder / "plait"))
    actual = {case: plait_run(plait, f"{i}.")
              for i, case in enumerate(sorted(CASES))}
    return actual, expected


def expect_dpo_matches(check, actual, expected):
    """plait's loss, metrics and gradients (`actual`, plait_run's) against
    TRL's (`expected`)."""
    harness.expect_close(f"{check}: loss", "loss", actual["loss"],
                         expected["loss"])
    metrics = {side: {name: torch.tensor([run["metrics"][name]])
                      for name in METRICS}
               for side, run in (("plait", actual), ("trl", expected))}
    for name in METRICS:
        if name in ("rewards/chosen", "rewards/rejected", "rewards/margins"):
            # A reward is beta times a difference of log-probabilities, which
            # cancel: its error is measured against beta times their scale.
            scale = expected["beta"] * max(
                abs(expected["metrics"][name]) for name in METRICS
                if name.startswith("logps/"))
            error = (metrics["plait"][name] - metrics["trl"][name]).abs().item()
            harness.record(f"{check}: rewards", error / scale)
            assert error <= harness.FP32_TOLERANCE * scale, (
                f"{check}: {name}: error {error:.3g} > 1e-5 * {scale:.3g}")
        else:
            harness.expect_close(f"{check}: metrics", name,
                                 metrics["plait"][name], metrics["trl"][name])
    harness.expect_close_gradients(check, actual["grads"], expected["grads"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_dpo_matches_trl(case, runs):
    actual, expected = (run[case] for run in runs)
    expect_dpo_matches(f"dpo {case}", actual, expected)


def test_adapters_off_dpo_matches_trl_without_a_reference_model(tmp_path):
    """DPO of LoRA adapters against the policy with its adapters off: plait's
    policy_without_adapters against TRL's DPOTrainer given a model, a PEFT
    config and no ref_model, which adds new adapters and disables them for the
    reference. Their B is drawn away from zero, as after some training, so
    that the policy is not its base."""
    harness.quiet_trl()
    harness.hf_model(MODEL, seed=0).save_pretrained(tmp_path / "policy")
    trainer = dpo_trainer(load_model(tmp_path / "policy"), None,
                          tmp_path / "trl", peft_config=peft.LoraConfig(
                              r=4, lora_alpha=8, lora_dropout=0.0,
                              target_modules=["q_proj", "v_proj"]))
    assert trainer.ref_model is None
    policy = trainer.model
    assert list(policy.peft_config) == ["default"], (
        "TRL keeps a reference adapter: its reference is not the base")
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if ".lora_B." in name:
                param.copy_(0.5 * torch.randn(param.shape,
                                              generator=generator))
    policy.save_pretrained(tmp_path / "adapter")
    trainer.model.zero_grad(set_to_none=True)
    loss, metrics = trl_step(trainer)
    loss.backward()
    expected = dict(
        loss=loss.detach().reshape(1), metrics=metrics, beta=trainer.beta,
        grads={harness.peft_to_plait_name(name): p.grad.clone()
               for name, p in trainer.model.named_parameters()
               if p.requires_grad})
    assert len(expected["grads"]) == 2 * 2 * harness.SMALL["num_hidden_layers"]

    write_pairs(trainer, tmp_path / "pairs.jsonl")
    (tmp_path / "configs.txt").write_text(
        "dpo { policy_without_adapters: true }\n")
    harness.run_plait("dpo", hf_dir=tmp_path / "policy",
                      lora='rank: 4 alpha: 8 target: "*q_proj" '
                           'target: "*v_proj"',
                      peft_dir=tmp_path / "adapter",
                      pairs=tmp_path / "pairs.jsonl",
                      configs=tmp_path / "configs.txt", out=tmp_path / "plait")
    actual = plait_run(harness.load_file(str(tmp_path / "plait")), "0.")
    expect_dpo_matches("dpo with the adapters off", actual, expected)
    # The adapters moved the policy off its base: the rewards are not zero.
    assert abs(expected["metrics"]["rewards/margins"]) > 1e-3


def test_pairs_are_neither_all_won_nor_all_lost(runs):
    """The comparison means something only if the rewards split the pairs
    and the hinge loss is active for some of them."""
    _, expected = runs
    accuracy = expected["sigmoid"]["metrics"]["rewards/accuracies"]
    assert 0.0 < accuracy < 1.0, accuracy
    assert expected["hinge"]["loss"].item() > 0.0
