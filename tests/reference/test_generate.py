"""plait's greedy generation against transformers' generate(do_sample=False):
every family's small model (the same weights: a folder transformers saved,
which plait loads), prompts of different lengths in one left-padded batch, 64
new tokens each, token for token; and each token's log-probability against
transformers' scores (output_scores, normalised: compute_transition_scores)
in fp32, within 1e-5."""

import json

import pytest
import torch
import transformers

import harness

NEW_TOKENS = 64
PROMPT_LENGTHS = [7, 3, 12]


def prompts(vocab_size, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(vocab_size, (length,), generator=generator).tolist()
            for length in PROMPT_LENGTHS]


def hf_greedy(model, prompt_ids):
    """transformers' greedy completions of prompt_ids in one left-padded
    batch, and each new token's log-probability."""
    longest = max(len(p) for p in prompt_ids)
    input_ids = torch.zeros(len(prompt_ids), longest, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, prompt in enumerate(prompt_ids):
        input_ids[row, longest - len(prompt):] = torch.tensor(prompt)
        attention_mask[row, longest - len(prompt):] = 1
    model.generation_config.eos_token_id = None  # every completion runs to its end
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask,
                             do_sample=False, max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, pad_token_id=0,
                             output_scores=True, return_dict_in_generate=True)
    scores = model.compute_transition_scores(out.sequences, out.scores,
                                             normalize_logits=True)
    return out.sequences[:, longest:], scores


def expect_greedy_completions_match(check, model, prompt_ids, tmp_path):
    """plait's greedy completions of prompt_ids by `model` (saved to a
    folder plait loads) equal transformers', token for token, and their
    log-probabilities are transformers' within the fp32 tolerance."""
    model.save_pretrained(tmp_path / "hf")
    (tmp_path / "prompts.json").write_text(json.dumps(prompt_ids))
    harness.run_plait("generate", hf_dir=tmp_path / "hf",
                      prompts=tmp_path / "prompts.json",
                      max_new_tokens=NEW_TOKENS, out=tmp_path / "plait.json")
    plait = json.loads((tmp_path / "plait.json").read_text())
    tokens, logprobs = hf_greedy(model, prompt_ids)
    assert len(plait) == len(prompt_ids)
    for row, completion in enumerate(plait):
        assert completion["tokens"] == tokens[row].tolist(), (
            f"{check}: prompt {row}: plait's greedy tokens differ from "
            f"transformers'")
        harness.expect_close(check, f"prompt {row} log-probabilities",
                             torch.tensor(completion["logprobs"]), logprobs[row])


@pytest.mark.parametrize("name", sorted(harness.CONFIGS))
def test_greedy_generation_matches_transformers(name, tmp_path):
    model = harness.hf_model(name)
    expect_greedy_completions_match(f"generate {name}", model,
                                    prompts(model.config.vocab_size), tmp_path)


def test_greedy_generation_of_a_qwen2_5_0_5b_shape_matches_transformers(tmp_path):
    """Qwen2.5-0.5B's shapes (hidden 896, 14 heads of 64 over 2 key/value
    heads, q/k/v biases, a tied 151,936-token vocabulary), 2 of its 24 layers,
    weights drawn at its initialiser's scale."""
    config = transformers.Qwen2Config(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=2,
        num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
        tie_word_embeddings=True, max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_theta=1000000.0)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).float().eval()
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param.dim() == 1:
                param.normal_(1.0 if param_name.endswith("norm.weight") else 0.0, 0.1)
    expect_greedy_completions_match("generate qwen2.5-0.5b shape", model,
                                    prompts(config.vocab_size, seed=1), tmp_path)
