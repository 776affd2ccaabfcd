"""plait's LoRA against PEFT's: the same base weights (a folder transformers
saved, which plait loads), PEFT's get_peft_model with the same rank, alpha,
targets and rsLoRA choice (dropout 0), the same adapter values (PEFT's A and a
random B, given to plait), and the same batch give the same logits, loss and
gradient of every adapter, in fp32, within 1e-5 relative. plait's trainable
parameters are exactly PEFT's, by name, and its initial adapters are PEFT's
kind: B zero, A uniform within 1/sqrt(in)."""

import math

import peft
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import harness

# name: (model, plait's target globs, PEFT's target_modules, r, alpha, rslora)
CASES = {
    "llama_q_v": ("llama_gqa", ["*q_proj", "*v_proj"], ["q_proj", "v_proj"],
                  4, 8.0, False),
    "qwen2_mlp_k_o_rslora": ("qwen2_gqa", ["*mlp.*", "*k_proj", "*o_proj"],
                             ["gate_proj", "up_proj", "down_proj", "k_proj",
                              "o_proj"], 4, 16.0, True),
    "llama_tied_bias_all": ("llama_tied_bias", ["*_proj"],
                            ["q_proj", "k_proj", "v_proj", "o_proj",
                             "gate_proj", "up_proj", "down_proj"],
                            2, 3.0, False),
}


def peft_case(case, tmp_path):
    """The case's transformers model, saved as tmp_path/hf; a batch for it in
    tmp_path/batch.safetensors; PEFT's model of it with the case's adapters
    (dropout 0); and plait's --lora text for the same adapters."""
    name, globs, modules, rank, alpha, rslora = CASES[case]
    model = harness.hf_model(name)
    model.save_pretrained(tmp_path / "hf")
    input_ids, labels = harness.make_batch(tmp_path / "batch.safetensors",
                                           model.config.vocab_size)
    peft_model = peft.get_peft_model(model, peft.LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=modules, lora_dropout=0.0,
        use_rslora=rslora))
    targets = " ".join(f'target: "{glob}"' for glob in globs)
    lora = (f"rank: {rank} alpha: {alpha} use_rslora: {str(rslora).lower()} "
            f"{targets}")
    return peft_model, input_ids, labels, lora


@pytest.mark.parametrize("case", sorted(CASES))
def test_lora_matches_peft(case, tmp_path):
    peft_model, input_ids, labels, lora = peft_case(case, tmp_path)
    generator = torch.Generator().manual_seed(1)
    adapters = {}
    with torch.no_grad():
        for peft_name, param in peft_model.named_parameters():
            if not param.requires_grad:
                continue
            if ".lora_B." in peft_name:
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))
            adapters[harness.peft_to_plait_name(peft_name)] = (
                param.detach().clone())
    save_file(adapters, str(tmp_path / "adapters.safetensors"))

    harness.run_plait(
        "lora", hf_dir=tmp_path / "hf", lora=lora,
        adapters=tmp_path / "adapters.safetensors",
        batch=tmp_path / "batch.safetensors",
        out=tmp_path / "plait.safetensors")
    plait = load_file(str(tmp_path / "plait.safetensors"))

    initial = {key.removeprefix("init."): value
               for key, value in plait.items() if key.startswith("init.")}
    assert sorted(initial) == sorted(adapters), (
        "plait's trainable parameters are not PEFT's adapters")
    for adapter, value in initial.items():
        if ".lora_B." in adapter:
            assert torch.count_nonzero(value) == 0, f"{adapter} is not zero"
        else:
            bound = 1.0 / math.sqrt(value.shape[1])
            assert 0.5 * bound < value.abs().max() <= bound, (
                f"{adapter} is not uniform within 1/sqrt(in)")

    peft_model.zero_grad(set_to_none=True)
    output = peft_model(input_ids=input_ids, labels=labels)
    output.loss.backward()
    check = f"lora {case}"
    harness.expect_close(f"{check}: logits", "logits", plait["logits"],
                         output.logits.detach())
    harness.expect_close(f"{check}: loss", "loss", plait["loss"],
                         output.loss.detach().reshape(1))
    harness.expect_close_gradients(
        check, harness.plait_gradients(plait),
        {harness.peft_to_plait_name(n): p.grad
         for n, p in peft_model.named_parameters() if p.requires_grad})


def test_peft_adapter_folders_load_both_ways(tmp_path):
    """An adapter folder PEFT saved gives plait PEFT's logits, and the folder
    plait saves from it loads in PEFT (PeftModel.from_pretrained on the same
    base folder) with the same logits again."""
    peft_model, input_ids, _, lora = peft_case("qwen2_mlp_k_o_rslora", tmp_path)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for peft_name, param in peft_model.named_parameters():
            if ".lora_B." in peft_name:
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))
    peft_model.save_pretrained(tmp_path / "peft")
    peft_model.eval()
    with torch.no_grad():
        expected = peft_model(input_ids=input_ids).logits

    harness.run_plait(
        "lora", hf_dir=tmp_path / "hf", lora=lora, peft_dir=tmp_path / "peft", save_peft_dir=tmp_path / "plait_adapter",
        batch=tmp_path / "batch.safetensors",
        out=tmp_path / "plait.safetensors")
    plait = load_file(str(tmp_path / "plait.safetensors"))
    harness.expect_close("peft folder into plait: logits", "logits",
                         plait["logits"], expected)

    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    loaded = peft.PeftModel.from_pretrained(base, tmp_path / "plait_adapter")
    loaded.eval()
    with torch.no_grad():
        reloaded = loaded(input_ids=input_ids).logits
    harness.expect_close("plait's folder into peft: logits", "logits",
                         reloaded, expected)
