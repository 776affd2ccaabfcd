"""What the reference tests share: running plait's side (plait_reference),
the small random Hugging Face models both sides compute with, and the error
measure.

Every comparison uses one measure per tensor, the error relative to the
tensor's scale: max|plait - reference| / max|reference|. The largest error
each check sees is printed at the end of the run (conftest.py).
"""

import logging
import os
import subprocess

import datasets
import tokenizers
import torch
import transformers
from safetensors.torch import load_file, save_file

# The tolerance: fp32 within 1e-5 relative.
FP32_TOLERANCE = 1e-5

BINARY = os.environ["PLAIT_REFERENCE"]

# The largest relative error each check has seen, for the summary.
max_errors = {}


def relative_error(actual, expected):
    """max|actual - expected| / max|expected|, computed in float64."""
    actual = actual.double()
    expected = expected.double()
    assert actual.shape == expected.shape, (
        f"shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    scale = expected.abs().max().item()
    error = (actual - expected).abs().max().item()
    return error / scale if scale > 0 else error


def record(check, error):
    max_errors[check] = max(max_errors.get(check, 0.0), error)


def expect_close(check, what, actual, expected, tolerance=FP32_TOLERANCE):
    """Asserts that relative_error(actual, expected) <= tolerance, and
    records the error under check."""
    error = relative_error(actual, expected)
    record(check, error)
    assert error <= tolerance, (
        f"{check}: {what}: relative error {error:.3g} > {tolerance:g}")


def run_plait(command, **flags):
    """Runs `plait_reference command --flag=value...`; a failure fails the
    test with plait's message."""
    args = [BINARY, command] + [f"--{k}={v}" for k, v in flags.items()]
    result = subprocess.run(args, capture_output=True, text=True)
    assert result.returncode == 0, (
        f"plait_reference {command} exited with {result.returncode}:\n"
        f"{result.stderr}")


# Small architectures that between them cover what plait supports:
# grouped-query attention, tied and untied embeddings, Llama's attention_bias,
# Llama 3's rope scaling and Qwen2's q/k/v biases. head_dim 16 and
# original_max_position_embeddings 64 put the llama3 rope's frequencies in all
# three of its bands (kept, smoothed, divided by the factor).
SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, vocab_size=128,
             max_position_embeddings=128, rms_norm_eps=1e-5)
LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=64)
CONFIGS = {
    "llama_gqa": ("llama", dict(num_key_value_heads=2,
                                tie_word_embeddings=False)),
    "llama_tied_bias": ("llama", dict(num_key_value_heads=4,
                                      tie_word_embeddings=True,
                                      attention_bias=True)),
    "llama3_rope": ("llama", dict(num_key_value_heads=2,
                                  tie_word_embeddings=True,
                                  rope_theta=500000.0,
                                  rope_scaling=LLAMA3_ROPE)),
    "qwen2_gqa": ("qwen2", dict(num_key_value_heads=2,
                                tie_word_embeddings=False)),
    "qwen2_tied": ("qwen2", dict(num_key_value_heads=1,
                                 tie_word_embeddings=True)),
    # Heads of 32, twice hidden_size / num_attention_heads, as Qwen3-0.6B's are.
    "qwen3_wide_heads": ("qwen3", dict(num_key_value_heads=2, head_dim=32,
                                       tie_word_embeddings=True)),
    "qwen3_bias": ("qwen3", dict(num_key_value_heads=4, head_dim=16,
                                 attention_bias=True,
                                 tie_word_embeddings=False)),
    # 4 experts of 32, 2 a token, renormalised over the chosen; a
    # load-balancing loss weighed enough that its gradient shows.
    "qwen3_moe": ("qwen3_moe", dict(num_key_value_heads=2, head_dim=16,
                                    num_experts=4, num_experts_per_tok=2,
                                    moe_intermediate_size=32,
                                    norm_topk_prob=True,
                                    router_aux_loss_coef=0.5,
                                    tie_word_embeddings=False)),
    # Layer 0 dense (mlp_only_layers), 3 of 6 experts a token, not
    # renormalised.
    "qwen3_moe_mixed": ("qwen3_moe", dict(num_key_value_heads=2, head_dim=16,
                                          num_experts=6, num_experts_per_tok=3,
                                          moe_intermediate_size=24,
                                          norm_topk_prob=False,
                                          router_aux_loss_coef=0.25,
                                          mlp_only_layers=[0],
                                          tie_word_embeddings=True)),
    # 4 experts of intermediate_size, 2 a token, always renormalised.
    "mixtral": ("mixtral", dict(num_key_value_heads=2, num_local_experts=4,
                                num_experts_per_tok=2,
                                router_aux_loss_coef=0.3,
                                tie_word_embeddings=False)),
}
CONFIG_CLASSES = {"llama": transformers.LlamaConfig,
                  "qwen2": transformers.Qwen2Config,
                  "qwen3": transformers.Qwen3Config,
                  "qwen3_moe": transformers.Qwen3MoeConfig,
                  "mixtral": transformers.MixtralConfig}
MODEL_CLASSES = {"llama": transformers.LlamaForCausalLM,
                 "qwen2": transformers.Qwen2ForCausalLM,
                 "qwen3": transformers.Qwen3ForCausalLM,
                 "qwen3_moe": transformers.Qwen3MoeForCausalLM,
                 "mixtral": transformers.MixtralForCausalLM}


def hf_config(name):
    """The transformers config of CONFIGS[name], with eager attention."""
    model_type, fields = CONFIGS[name]
    config = CONFIG_CLASSES[model_type](**SMALL, **fields)
    config._attn_implementation = "eager"
    return config


def hf_model(name, seed=0):
    """A transformers model of CONFIGS[name] in fp32, with weights large
    enough that attention is far from uniform (so that rope matters), and
    biases and norm weights that are not constant."""
    config = hf_config(name)
    model = MODEL_CLASSES[config.model_type](config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if param_name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * noise)
            elif param.dim() == 1:
                param.copy_(0.1 * noise)
            else:
                param.copy_(0.15 * noise)
    return model.float().eval()


def make_batch(path, vocab_size, seed=0, batch=2, length=24):
    """Writes random input_ids and labels (Hugging Face's convention, some
    ignored with -100) to path, and returns them."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(vocab_size, (batch, length), generator=generator)
    labels = input_ids.clone()
    labels[0, 3:6] = -100
    labels[1, -4:] = -100
    save_file({"input_ids": input_ids, "labels": labels}, str(path))
    return input_ids, labels


def compare_forward_backward(check, plait_file, model, input_ids, labels):
    """Checks the logits, loss and every gradient plait wrote to plait_file
    against transformers' model on the same batch."""
    plait = load_file(str(plait_file))
    model.zero_grad(set_to_none=True)
    # A mixture of experts' loss with its load-balancing loss, which
    # transformers adds only with output_router_logits.
    moe = getattr(model.config, "num_experts", 0) > 0
    output = model(input_ids=input_ids, labels=labels,
                   output_router_logits=moe or None)
    output.loss.backward()
    expect_close(f"{check}: logits", "logits", plait["logits"],
                 output.logits.detach())
    expect_close(f"{check}: loss", "loss", plait["loss"],
                 output.loss.detach().reshape(1))
    if moe:
        expect_close(f"{check}: aux_loss", "aux_loss", plait["aux_loss"],
                     output.aux_loss.detach().reshape(1))
    expect_close_gradients(check, plait_gradients(plait), hf_gradients(model))


# What a mixture-of-experts block and its experts' projections (gate, up,
# down) are called in the folders transformers saves, by model type.
SAVED_MOE_NAMES = {"qwen3_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
                   "mixtral": ("block_sparse_moe", "w1", "w3", "w2")}


def hf_gradients(model):
    """The gradient of each of model's parameters by the name its saved
    folder gives it: transformers 5 holds a layer's experts stacked
    (mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj [E, H, I])
    and saves them one by one as the original checkpoints name them
    (Qwen3-MoE's mlp.experts.<e>.gate_proj.weight, Mixtral's
    block_sparse_moe.experts.<e>.w1.weight, ...)."""
    block, gate_name, up_name, down_name = SAVED_MOE_NAMES.get(
        model.config.model_type, ("mlp",) * 4)
    grads = {}
    for name, param in model.named_parameters():
        name = name.replace(".mlp.gate.", f".{block}.gate.")
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name.removesuffix("mlp.experts.gate_up_proj") + block
            for e, grad in enumerate(param.grad):
                gate, up = grad.chunk(2, dim=0)
                grads[f"{prefix}.experts.{e}.{gate_name}.weight"] = gate
                grads[f"{prefix}.experts.{e}.{up_name}.weight"] = up
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name.removesuffix("mlp.experts.down_proj") + block
            for e, grad in enumerate(param.grad):
                grads[f"{prefix}.experts.{e}.{down_name}.weight"] = grad
        else:
            grads[name] = param.grad
    return grads


def peft_to_plait_name(peft_name):
    """PEFT's `base_model.model.<module>.lora_A.default.weight` as plait (and
    PEFT's saved adapters) name it: `<module>.lora_A.weight`."""
    name = peft_name.removeprefix("base_model.model.")
    return name.replace(".lora_A.default.", ".lora_A.").replace(
        ".lora_B.default.", ".lora_B.")


def plait_gradients(results, prefix=""):
    """The gradients plait_reference wrote as `<prefix>grad.<name>`, by
    name."""
    start = prefix + "grad."
    return {key[len(start):]: value for key, value in results.items()
            if key.startswith(start)}


def expect_close_gradients(check, actual, expected):
    """Checks plait's gradients (`actual`, by Hugging Face name) against
    transformers' (`expected`): the same parameters, each close."""
    assert sorted(actual) == sorted(expected), (
        "plait's parameters are not transformers' parameters")
    for name, grad in expected.items():
        expect_close(f"{check}: gradients", name, actual[name], grad)


# The word-level tokenizer of the TRL comparisons: word "t<i>" is token id i
# (TRL tokenizes text and appends EOS).
EOS, PAD = 1, 0


def tokenizer():
    vocab = {"<pad>": PAD, "</s>": EOS}
    vocab.update({f"t{i}": i for i in range(2, SMALL["vocab_size"])})
    words = tokenizers.Tokenizer(
        tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, eos_token="</s>", pad_token="<pad>")


def random_words(seed):
    """A function of a length that returns that many random words of
    tokenizer(), drawn in turn from one generator seeded `seed`."""
    generator = torch.Generator().manual_seed(seed)

    def text(length):
        ids = torch.randint(2, SMALL["vocab_size"], (length,),
                            generator=generator)
        return " ".join(f"t{i}" for i in ids.tolist())

    return text


def quiet_trl():
    """Leaves TRL's, transformers' and datasets' progress and warnings out of
    the test's output."""
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    logging.getLogger("trl").setLevel(logging.ERROR)
