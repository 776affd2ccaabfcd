"""plait's tokenizers against Hugging Face's `tokenizers` (the Rust implementation) and
Google's `sentencepiece`, live: //tools:tokenize writes the test corpus
(data/tokenizer/testdata/corpus.json, and the testdata README's paragraphs) to token shards
with each test tokenizer, and every document's ids must be the reference's, after the EOS
that separates documents. The committed goldens of data/tokenizer's C++ tests come from the
same implementations (data/tokenizer/testdata/make_goldens.py); this re-checks them against
the installed versions."""

import gzip
import importlib.util
import json
import os
import subprocess

import numpy
import pytest
import sentencepiece
import tokenizers

TOKENIZE = os.environ["PLAIT_TOKENIZE"]
TESTDATA = "data/tokenizer/testdata"


def documents():
    with open(os.path.join(TESTDATA, "corpus.json"), encoding="utf-8") as f:
        corpus = json.load(f)
    texts = [case["text"] if "text" in case else
             bytes.fromhex(case["hex"]).decode("utf-8", errors="replace")
             for case in corpus]
    with open(os.path.join(TESTDATA, "README.md"), encoding="utf-8") as f:
        texts += f.read().split("\n\n")
    return texts


def reference(name):
    """(encode with the file's special tokens, EOS id) of the reference implementation."""
    folder = os.path.join(TESTDATA, name)
    if name == "mistral":
        sp = sentencepiece.SentencePieceProcessor(
            model_file=os.path.join(folder, "tokenizer.model"))
        return (lambda text: [sp.bos_id()] + sp.encode(text)), sp.eos_id()
    path = os.path.join(folder, "tokenizer.json")
    if os.path.exists(path):
        tok = tokenizers.Tokenizer.from_file(path)
    else:
        with gzip.open(path + ".gz", "rt", encoding="utf-8") as f:
            tok = tokenizers.Tokenizer.from_str(f.read())
    with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
        eos = json.load(f)["eos_token"]
    return (lambda text: tok.encode(text, add_special_tokens=True).ids), tok.token_to_id(eos)


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, _, count = numpy.frombuffer(data[:12], "<i4")
    width = {20240520: "<u2", 20240801: "<u4"}[magic]  # llm.c's GPT-2 and Llama 3 headers
    return numpy.frombuffer(data[1024:], width)[:count].tolist()


@pytest.mark.parametrize("name", ["gpt2", "qwen3", "tiny", "mistral"])
def test_tokenize_gives_the_reference_ids(name, tmp_path):
    texts = documents()
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n"
                              for t in texts), encoding="utf-8")
    result = subprocess.run(
        [TOKENIZE, f"--tokenizer={TESTDATA}/{name}", f"--input={corpus}",
         f"--output={tmp_path}/out", "--threads=2"],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    encode, eos = reference(name)
    expected = []
    for text in texts:
        expected += [eos] + encode(text)
    assert read_shard(f"{tmp_path}/out_train_000000.bin") == expected


@pytest.mark.parametrize("table", ["unicode_additions.inc", "unicode_after_9.inc"])
def test_unicode_tables_are_what_their_script_writes(table):
    """data/tokenizer's Unicode tables (the categories plait's split regexes are widened by,
    the code points its normalizers pass through) are make_unicode_tables.py's output."""
    path = "data/tokenizer/make_unicode_tables.py"
    spec = importlib.util.spec_from_file_location("make_unicode_tables", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with open(f"data/tokenizer/{table}", encoding="utf-8") as f:
        assert f.read() == script.OUTPUTS[table]()


@pytest.mark.parametrize("letter, is_letter", [
    ("\U0001E4D0", True),   # Unicode 15.0: NAG MUNDARI LETTER O
    ("\U00010D50", True),   # Unicode 16.0: GARAY CAPITAL LETTER A
    ("\U00010940", False),  # Unicode 17.0 (Sidetic): no letter to tokenizers 0.23
])
def test_tokenizers_matches_regexes_by_unicode_16(letter, is_letter):
    """The Unicode version make_unicode_tables.py widens to is the one `tokenizers`
    matches \\p{L} by: a new `tokenizers` with a newer table fails here first."""
    split = tokenizers.pre_tokenizers.Split(tokenizers.Regex(r"\p{L}+"), behavior="isolated")
    pieces = [piece for piece, _ in split.pre_tokenize_str("a" + letter + "b")]
    assert pieces == (["a" + letter + "b"] if is_letter else ["a", letter, "b"])


@pytest.mark.parametrize("mark, known", [
    ("\U0001E944", True),   # Unicode 9.0: ADLAM ALIF LENGTHENER, combining class 230
    ("\u1DF6", False),      # Unicode 10.0: COMBINING KAVYKA ABOVE RIGHT, 232
    ("\U0001E4EC", False),  # Unicode 15.0: NAG MUNDARI SIGN MUHOR, 232
])
def test_tokenizers_normalizes_by_unicode_9(mark, known):
    """The Unicode version after which make_unicode_tables.py lists code points is the last
    one `tokenizers`' NFC knows: a mark it knows goes after U+0316 (class 220), one it does not
    stays where it is."""
    text = mark + "\u0316"
    expected = "\u0316" + mark if known else text
    assert tokenizers.normalizers.NFC().normalize_str(text) == expected
