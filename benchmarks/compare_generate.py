"""plait's decoding against transformers' generate on the CPU, side by side:
greedy, 128 new tokens after prompts of 128 random tokens, a batch of 1 and of
16 prompts, fp32, one compute thread, on the medium model (Llama, hidden 512,
8 layers, vocab 4096) and on Qwen2.5-0.5B's widths and 151,936-token
vocabulary with 2 of its 24 layers:

  plait            //benchmarks:generate_bench (generation::Generate)
  HF eager         transformers' generate, attn_implementation="eager"
  HF sdpa          the same with "sdpa" (PyTorch's fused attention)

Both sides count new tokens a second over the whole generation, the prompts'
forward included. Not part of the test suite; run it in the venv
tools/setup.sh builds, from the repository root:

  /opt/plait/venv/bin/python benchmarks/compare_generate.py

It builds //benchmarks:generate_bench with --config=opt first (or takes
--plait_bench) and prints each rate and plait's ratio to each. About 3
minutes on 2 cores.
"""

import argparse
import json
import subprocess
import time

import torch
import transformers

PROMPT_TOKENS = 128
NEW_TOKENS = 128
SHAPES = {
    # generate_bench's range(0): 0 and 1.
    "medium": (0, transformers.LlamaConfig,
               dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                    num_attention_heads=8, num_key_value_heads=8,
                    vocab_size=4096, max_position_embeddings=2048,
                    rope_theta=10000.0, rms_norm_eps=1e-5,
                    tie_word_embeddings=False)),
    "Qwen2.5-0.5B widths, 2 layers": (
        1, transformers.Qwen2Config,
        dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=2,
             num_attention_heads=14, num_key_value_heads=2,
             vocab_size=151936, max_position_embeddings=32768,
             rope_theta=1000000.0, rms_norm_eps=1e-6,
             tie_word_embeddings=True)),
}
BATCHES = [1, 16]


def plait_rates(binary):
    """{(shape index, batch): new tokens/s} from generate_bench."""
    out = subprocess.run([binary, "--benchmark_format=json"], check=True,
                         capture_output=True, text=True).stdout
    rates = {}
    for row in json.loads(out)["benchmarks"]:
        _, which, batch = row["run_name"].split("/")[:3]
        rates[(int(which), int(batch))] = row["new_tokens_per_s"]
    return rates


def hf_rate(config_class, fields, batch, attention):
    """transformers' greedy generate: new tokens/s over the whole call."""
    config = config_class(**fields)
    config._attn_implementation = attention
    torch.manual_seed(1)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    model.generation_config.eos_token_id = None
    ids = torch.randint(fields["vocab_size"], (batch, PROMPT_TOKENS))
    with torch.no_grad():
        start = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                       do_sample=False, max_new_tokens=NEW_TOKENS,
                       min_new_tokens=NEW_TOKENS, pad_token_id=0)
        seconds = time.perf_counter() - start
    return batch * NEW_TOKENS / seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plait_bench", default="",
                        help="generate_bench to run (default: built here)")
    args = parser.parse_args()
    binary = args.plait_bench
    if not binary:
        subprocess.run(["bazel", "build", "--config=opt",
                        "//benchmarks:generate_bench"], check=True)
        binary = "bazel-bin/benchmarks/generate_bench"
    torch.set_num_threads(1)
    plait = plait_rates(binary)
    print(f"{'shape':32} {'batch':>5} {'plait':>9} {'HF eager':>9} "
          f"{'HF sdpa':>9} {'x eager':>8} {'x sdpa':>8}   (new tokens/s)")
    for name, (which, config_class, fields) in SHAPES.items():
        for batch in BATCHES:
            eager = hf_rate(config_class, fields, batch, "eager")
            sdpa = hf_rate(config_class, fields, batch, "sdpa")
            ours = plait[(which, batch)]
            print(f"{name:32} {batch:5d} {ours:9.1f} {eager:9.1f} {sdpa:9.1f} "
                  f"{ours / eager:8.2f} {ours / sdpa:8.2f}", flush=True)


if __name__ == "__main__":
    main()
