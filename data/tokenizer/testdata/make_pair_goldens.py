"""Writes goldens/text_pairs.json: how TRL tokenizes text SFT examples and preference pairs.

Run from the repository root in the reference venv (tools/setup.sh builds /opt/plait/venv;
TRL 1.16.0, transformers 5.17.0, tokenizers 0.23.2 when this file was written):

  /opt/plait/venv/bin/python data/tokenizer/testdata/make_pair_goldens.py

For each byte-level BPE test tokenizer, the examples below go through TRL's own
SFTTrainer._prepare_dataset and DPOTrainer._prepare_dataset (called on a stand-in for the
trainer, which those methods read only the tokenizer and chat template from), so the goldens
are what TRL trains on, boundary and EOS included. text_pairs_test.cc reads them.
"""

import json
import os
import tempfile
import types

from datasets import Dataset
from transformers import AutoTokenizer
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

HERE = os.path.dirname(os.path.abspath(__file__))

# "{eos}" stands for the tokenizer's EOS token: TRL adds none to a completion that ends with it.
SFT = [
    {"prompt": "Q: 2 + 2 =", "completion": " 4"},
    {"prompt": "Hel", "completion": "lo, world"},  # merges across the boundary
    {"prompt": "Answer: ", "completion": "yes"},  # the prompt's space joins the completion
    {"prompt": "Translate: 你好", "completion": " → Hello 🤗\n"},
    {"prompt": "def f():\n", "completion": "    return 1\n"},
    {"prompt": "Say bye.", "completion": " Bye!{eos}"},
]
DPO = [
    {"prompt": "Which is blue? ", "chosen": "The sky.", "rejected": "Grass"},
    {"prompt": "Hel", "chosen": "lo", "rejected": "p"},  # chosen and rejected cut it apart
    {"prompt": "你好", "chosen": "Hello 🤗", "rejected": "Bye{eos}"},
]


def tokenizer_folder(name, work):
    """A folder AutoTokenizer reads: the test tokenizer's files, unpacked if gzipped."""
    source = os.path.join(HERE, name)
    if os.path.exists(os.path.join(source, "tokenizer.json")):
        return source
    import gzip
    import shutil
    folder = os.path.join(work, name)
    os.makedirs(folder)
    with gzip.open(os.path.join(source, "tokenizer.json.gz"), "rb") as f, \
            open(os.path.join(folder, "tokenizer.json"), "wb") as out:
        shutil.copyfileobj(f, out)
    shutil.copy(os.path.join(source, "tokenizer_config.json"), folder)
    return folder


def with_eos(examples, eos):
    return [{k: v.replace("{eos}", eos) for k, v in example.items()} for example in examples]


def goldens(tok, work):
    common = dict(output_dir=work, max_length=None, report_to=[], use_cpu=True, bf16=False)
    stand_in = types.SimpleNamespace(_tokenizer=tok, chat_template=None, completion_only_loss=True)
    sft = with_eos(SFT, tok.eos_token)
    rows = SFTTrainer._prepare_dataset(stand_in, Dataset.from_list(sft), tok, SFTConfig(**common),
                                       False, None, "train")
    sft_out = []
    for example, row in zip(sft, rows):
        start = next(i for i, label in enumerate(row["labels"]) if label != -100)
        sft_out.append({**example, "input_ids": row["input_ids"], "completion_start": start})
    dpo = with_eos(DPO, tok.eos_token)
    rows = DPOTrainer._prepare_dataset(stand_in, Dataset.from_list(dpo), tok, DPOConfig(**common),
                                       "train")
    dpo_out = [{**example, "prompt_ids": row["prompt_ids"], "chosen_ids": row["chosen_ids"],
                "rejected_ids": row["rejected_ids"]} for example, row in zip(dpo, rows)]
    return {"sft": sft_out, "dpo": dpo_out}


def main():
    out = {}
    with tempfile.TemporaryDirectory() as work:
        for name in ["gpt2", "qwen3", "tiny"]:
            out[name] = goldens(AutoTokenizer.from_pretrained(tokenizer_folder(name, work)), work)
    with open(os.path.join(HERE, "goldens", "text_pairs.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
