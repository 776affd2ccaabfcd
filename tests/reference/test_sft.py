"""plait's SFT step against TRL's SFTTrainer over two accumulated
micro-batches whose completions differ a lot in length: the step's loss and
every gradient.

TRL's side is its own trainer: an SFTTrainer whose data preparation and
collator make the two micro-batches, whose get_batch_samples counts the
step's completion tokens (num_items_in_batch) and whose training_step runs
each micro-batch's forward and backward, as its training loop does. Each
micro-batch's summed token loss is divided by the step's count, so the step's
loss is the mean over all its completion tokens, not the mean of the two
micro-batches' means. plait's side reads the same micro-batches and
accumulates them as its trainer does (objectives/step_items.h).
"""

import datasets
import pytest
import torch
import transformers
import trl

import harness

MODEL = "llama_gqa"

# (prompt, completion) words of each example: the first micro-batch's two
# completions are short, the second's long.
LENGTHS = [(3, 1), (5, 2), (2, 20), (4, 27)]
MICRO_BATCH = 2


def sft_texts():
    text = harness.random_words(seed=11)
    return datasets.Dataset.from_dict({
        "prompt": [text(prompt) for prompt, _ in LENGTHS],
        # TRL tokenizes prompt + completion as one text.
        "completion": [" " + text(completion) for _, completion in LENGTHS],
    })


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """TRL's and plait's step loss and gradients, and the micro-batches."""
    harness.quiet_trl()
    folder = tmp_path_factory.mktemp("sft")
    harness.hf_model(MODEL, seed=0).save_pretrained(folder / "model")

    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder / "model", attn_implementation="eager").float()
    args = trl.SFTConfig(
        output_dir=str(folder / "trl"), report_to=[], use_cpu=True,
        bf16=False, per_device_train_batch_size=MICRO_BATCH,
        gradient_accumulation_steps=len(LENGTHS) // MICRO_BATCH)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=sft_texts(),
                             processing_class=harness.tokenizer())
    examples = [dict(example) for example in trainer.train_dataset]
    micro_batches = [trainer.data_collator(examples[i:i + MICRO_BATCH])
                     for i in range(0, len(examples), MICRO_BATCH)]
    micro_batches, num_items = trainer.get_batch_samples(
        iter(micro_batches), len(micro_batches), trainer.args.device)
    trainer.current_gradient_accumulation_steps = len(micro_batches)
    trainer.model.zero_grad(set_to_none=True)
    # Trainer sums what training_step returns into the step's logged loss.
    loss = sum(trainer.training_step(trainer.model, batch, num_items)
               for batch in micro_batches)
    expected = dict(
        loss=loss.detach().reshape(1),
        grads={name: p.grad.clone()
               for name, p in trainer.model.named_parameters()})

    paths = []
    for i, batch in enumerate(micro_batches):
        paths.append(folder / f"batch{i}")
        harness.save_file({"input_ids": batch["input_ids"].contiguous(),
                           "labels": batch["labels"].contiguous()},
                          str(paths[-1]))
    harness.run_plait("sft_step", hf_dir=folder / "model",
                      batch=",".join(str(path) for path in paths),
                      out=folder / "plait")
    plait = harness.load_file(str(folder / "plait"))
    actual = dict(loss=plait["loss"], grads=harness.plait_gradients(plait))
    return actual, expected, micro_batches, model


def test_sft_step_matches_trl(runs):
    actual, expected, _, _ = runs
    check = "sft accumulated step"
    harness.expect_close(f"{check}: loss", "loss", actual["loss"],
                         expected["loss"])
    harness.expect_close_gradients(check, actual["grads"], expected["grads"])


def test_the_micro_batches_make_the_normalisation_matter(runs):
    """The comparison means something only if the micro-batches score very
    different numbers of tokens and the mean of their means is another
    loss."""
    _, expected, micro_batches, model = runs
    counts = [(batch["labels"][:, 1:] != -100).sum().item()
              for batch in micro_batches]
    assert counts[0] * 5 < counts[1], counts
    with torch.no_grad():
        means = [model(input_ids=batch["input_ids"],
                       labels=batch["labels"]).loss.item()
                 for batch in micro_batches]
    mean_of_means = sum(means) / len(means)
    step = expected["loss"].item()
    assert abs(mean_of_means - step) > 1e-3 * step, (mean_of_means, step)
