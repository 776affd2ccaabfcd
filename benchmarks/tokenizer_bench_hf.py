"""Hugging Face's tokenizers on the corpus of //benchmarks:tokenizer_bench, for its ratios.

  bazel run --config=opt //benchmarks:tokenizer_bench -- --write_corpus=/tmp/corpus.txt
  /opt/plait/venv/bin/python benchmarks/tokenizer_bench_hf.py /tmp/corpus.txt [NAME...]

NAMEs (gpt2, qwen3, tiny, mistral; all by default) choose the tokenizers. Encodes each blank-line-separated document with `tokenizers` (Rust, called from Python, one
document per call, as tokenizer_bench does) with a freshly loaded tokenizer per pass, and
prints MB per CPU second of the process (RAYON_NUM_THREADS=1 keeps the Rust side on one
thread), the figure tokenizer_bench reports as MB/cpu_s, beside MB per second of wall time
(MB/s/core on one thread there); then the same for all documents in
one encode_batch call, which saves Python's per-call cost. Mistral's SentencePiece model is
measured with Google's `sentencepiece`.
"""

import gzip
import os
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import sentencepiece  # noqa: E402
import tokenizers  # noqa: E402

TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "tokenizer",
                        "testdata")


def load(name):
    path = os.path.join(TESTDATA, name, "tokenizer.json")
    if name == "mistral":
        processor = sentencepiece.SentencePieceProcessor(
            model_file=os.path.join(TESTDATA, name, "tokenizer.model"))
        return processor.encode, lambda texts: processor.encode(texts)
    if os.path.exists(path):
        tok = tokenizers.Tokenizer.from_file(path)
    else:
        with gzip.open(path + ".gz", "rt", encoding="utf-8") as f:
            tok = tokenizers.Tokenizer.from_str(f.read())
    return (lambda text: tok.encode(text, add_special_tokens=False).ids,
            lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)])


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        corpus = f.read()
    documents = [d for d in corpus.split("\n\n") if d]
    size = len(corpus.encode("utf-8"))
    passes = 2
    for name in sys.argv[2:] or ["gpt2", "qwen3", "tiny", "mistral"]:
        one_seconds = one_wall_seconds = batch_seconds = 0.0
        tokens = 0
        for _ in range(passes):
            encode, _ = load(name)
            start = time.process_time()
            start_wall = time.perf_counter()
            for document in documents:
                tokens += len(encode(document))
            one_seconds += time.process_time() - start
            one_wall_seconds += time.perf_counter() - start_wall
            _, encode_batch = load(name)
            start = time.process_time()
            encode_batch(documents)
            batch_seconds += time.process_time() - start
        print(f"{name}: {size * passes / 1e6 / one_seconds:.2f} MB/cpu_s "
              f"({size * passes / 1e6 / one_wall_seconds:.2f} MB/s wall) one document a call, "
              f"{size * passes / 1e6 / batch_seconds:.2f} MB/cpu_s in one batch, "
              f"{size * passes / tokens:.3f} bytes/token")


if __name__ == "__main__":
    main()
