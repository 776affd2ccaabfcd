"""plait's packed SFT (PACKING_BFD) against TRL's SFTTrainer with
packing=True, packing_strategy="bfd" and padding_free=True on the same text:
the same packed rows (ids, positions and scored labels) and the same step loss
and gradients.

TRL's side is its own trainer: its data preparation tokenizes and packs the
examples, its collator flattens the packed rows into one padding-free row with
position_ids, and its training_step runs the forward and backward (Hugging
Face's attention keeps each sequence to itself from the position_ids).
plait's side packs the same examples' ids (as TRL tokenized them, unpacked)
with its own DataLoader into rows of seq_len tokens, each with its positions,
and runs the sft objective over them.
"""

import json

import datasets
import pytest
import torch
import transformers
import trl

import harness

MODEL = "llama_gqa"
SEQ_LEN = 64

# (prompt, completion) words of each example: completions of a word or two
# beside long ones, so that best fit has rows to fill.
LENGTHS = [(3, 1), (5, 2), (2, 20), (4, 27), (6, 9), (1, 3), (8, 14),
           (2, 1), (3, 30), (5, 5), (1, 2), (7, 18)]


def sft_texts():
    text = harness.random_words(seed=12)
    return datasets.Dataset.from_dict({
        "prompt": [text(prompt) for prompt, _ in LENGTHS],
        "completion": [" " + text(completion) for _, completion in LENGTHS],
    })


def trl_trainer(folder, model, packed, batch):
    args = trl.SFTConfig(
        output_dir=str(folder / ("packed" if packed else "unpacked")),
        report_to=[], use_cpu=True, bf16=False,
        per_device_train_batch_size=batch, max_length=SEQ_LEN,
        packing=packed, packing_strategy="bfd", padding_free=packed)
    return trl.SFTTrainer(model=model, args=args, train_dataset=sft_texts(),
                          processing_class=harness.tokenizer())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    harness.quiet_trl()
    folder = tmp_path_factory.mktemp("packing")
    harness.hf_model(MODEL, seed=0).save_pretrained(folder / "model")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder / "model", attn_implementation="eager").float()

    # The examples' ids as TRL tokenizes them, one to a row, for plait.
    unpacked = trl_trainer(folder, model, packed=False, batch=1)
    with open(folder / "sft.jsonl", "w") as out:
        for example in unpacked.train_dataset:
            ids, labels = example["input_ids"], example["labels"]
            prompt = next(i for i, label in enumerate(labels) if label != -100)
            out.write(json.dumps({"prompt": ids[:prompt],
                                  "completion": ids[prompt:]}) + "\n")

    trainer = trl_trainer(folder, model, packed=True, batch=len(LENGTHS))
    rows = [dict(row) for row in trainer.train_dataset]
    micro_batches, num_items = trainer.get_batch_samples(
        iter([trainer.data_collator(rows)]), 1, trainer.args.device)
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.training_step(trainer.model, micro_batches[0], num_items)
    expected = dict(
        loss=loss.detach().reshape(1),
        grads={name: p.grad.clone()
               for name, p in trainer.model.named_parameters()})

    harness.run_plait("sft_step", hf_dir=folder / "model",
                      pairs=folder / "sft.jsonl", seq_len=SEQ_LEN,
                      out=folder / "plait")
    plait = harness.load_file(str(folder / "plait"))
    actual = dict(loss=plait["loss"], grads=harness.plait_gradients(plait))
    return actual, expected, rows, plait


def test_rows_are_trls(runs):
    _, _, rows, plait = runs
    assert plait["inputs"].shape[0] == len(rows)
    # The file packs into fewer rows than examples, some of several sequences.
    assert len(rows) < len(LENGTHS)
    assert any(len(row["seq_lengths"]) > 2 for row in rows)
    for r, row in enumerate(rows):
        length = len(row["input_ids"])
        assert plait["inputs"][r, :length].tolist() == row["input_ids"], r
        positions = [t for n in row["seq_lengths"] for t in range(n)]
        assert plait["positions"][r, :length].tolist() == positions, r
        # plait's targets are the next token's label within a sequence.
        targets = []
        for t in range(length):
            last = t + 1 == length or positions[t + 1] == 0
            targets.append(-100 if last else row["labels"][t + 1])
        assert plait["targets"][r, :length].tolist() == targets, r
        # The row's tail scores nothing.
        assert (plait["targets"][r, length:] == -100).all(), r


def test_packed_step_matches_trl(runs):
    actual, expected, _, _ = runs
    check = "sft packed step"
    harness.expect_close(f"{check}: loss", "loss", actual["loss"],
                         expected["loss"])
    harness.expect_close_gradients(check, actual["grads"], expected["grads"])
