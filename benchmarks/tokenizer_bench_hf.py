"""One pass of the reference implementation, for //benchmarks:tokenizer_bench's side-by-side
benchmark, which runs it between its own passes (plait, reference, plait, reference ...):

  tokenizer_bench_hf.py FOLDER CORPUS

loads the tokenizer in FOLDER (tokenizer.json with Hugging Face's `tokenizers`, the Rust
implementation; tokenizer.model with Google's `sentencepiece`), encodes each
blank-line-separated document of CORPUS with one call per document, as tokenizer_bench does,
and prints one JSON line: the CPU seconds of the load and of the encoding (the process's, with
RAYON_NUM_THREADS=1 keeping the Rust side on one thread), the encoding's wall seconds and the
number of tokens.
"""

import json
import os
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import sentencepiece  # noqa: E402
import tokenizers  # noqa: E402


def load(folder):
    """The tokenizer's encode function: text to ids, without special tokens."""
    model = os.path.join(folder, "tokenizer.json")
    if os.path.exists(model):
        tok = tokenizers.Tokenizer.from_file(model)
        return lambda text: tok.encode(text, add_special_tokens=False).ids
    processor = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(folder, "tokenizer.model"))
    return processor.encode


def main():
    folder, corpus_path = sys.argv[1:]
    with open(corpus_path, encoding="utf-8") as f:
        documents = [d for d in f.read().split("\n\n") if d]
    start = time.process_time()
    encode = load(folder)
    load_seconds = time.process_time() - start
    tokens = 0
    start, start_wall = time.process_time(), time.perf_counter()
    for document in documents:
        tokens += len(encode(document))
    print(json.dumps({"load_cpu_s": load_seconds, "encode_cpu_s": time.process_time() - start,
                      "encode_wall_s": time.perf_counter() - start_wall, "tokens": tokens}))


if __name__ == "__main__":
    main()
