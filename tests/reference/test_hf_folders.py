"""Hugging Face folders across the two stacks: a folder plait saves loads in
transformers with the outputs of the model plait saved, and a sharded folder
transformers saves trains in plait step for step as it trains in transformers
with torch.optim."""

import copy

import pytest
import torch
import transformers
from safetensors.torch import load_file

import harness


def load_in_transformers(folder):
    """The fp32 model transformers loads from folder, after checking that it
    used every tensor and found every parameter."""
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        folder, output_loading_info=True, attn_implementation="eager",
        dtype=torch.float32)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys",
                 "error_msgs"):
        assert not info[kind], f"transformers reports {kind}: {info[kind]}"
    return model.eval()


# Every architecture in one file; two of them sharded too (20 kB files).
FOLDERS = ([(name, 0) for name in sorted(harness.CONFIGS)]
           + [("llama3_rope", 20000), ("qwen2_tied", 20000)])


@pytest.mark.parametrize("name,shard_bytes", FOLDERS)
def test_folder_saved_by_plait_loads_in_transformers(name, shard_bytes,
                                                     tmp_path):
    # plait reads the config.json transformers writes, and writes its own.
    expected_config = harness.hf_config(name)
    expected_config.to_json_file(tmp_path / "config.json")
    input_ids, labels = harness.make_batch(tmp_path / "batch.safetensors",
                                           expected_config.vocab_size)
    harness.run_plait("save_hf", config=tmp_path / "config.json", seed=7,
                      hf_dir=tmp_path / "hf", max_shard_bytes=shard_bytes,
                      batch=tmp_path / "batch.safetensors",
                      out=tmp_path / "plait.safetensors")
    index = tmp_path / "hf" / "model.safetensors.index.json"
    assert index.exists() == bool(shard_bytes)

    model = load_in_transformers(tmp_path / "hf")
    for field in ("hidden_size", "num_key_value_heads", "rms_norm_eps",
                  "tie_word_embeddings", "rope_parameters"):
        assert (getattr(model.config, field)
                == getattr(expected_config, field)), field
    harness.compare_forward_backward(
        f"plait folder in transformers {name}",
        tmp_path / "plait.safetensors", model, input_ids, labels)


# A short run: AdamW with decoupled weight decay except on norms and biases,
# and a cosine schedule after a linear warmup; in plait's configs here, in
# torch's terms in train_in_transformers.
STEPS = 6
PEAK_LR = 3e-3
PLAIT_OPTIMIZER = r"""
  adamw { beta1: 0.9 beta2: 0.95 eps: 1e-8 }
  weight_decay: 0.1
  param_groups { name: "no_decay" regex: ".*(norm\\.weight|\\.bias)"
                 weight_decay: 0 }
"""
PLAIT_SCHEDULE = (f"lr: {PEAK_LR} total_steps: {STEPS} "
                  "warmup { steps: 2 } cosine {}")


def train_in_transformers(model, input_ids, labels):
    """The same run with torch.optim.AdamW and transformers.get_scheduler;
    returns the loss before each step."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        skip = name.endswith("norm.weight") or name.endswith(".bias")
        (no_decay if skip else decay).append(param)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=PEAK_LR, betas=(0.9, 0.95), eps=1e-8)
    scheduler = transformers.get_scheduler(
        "cosine", optimizer, num_warmup_steps=2, num_training_steps=STEPS)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        losses.append(loss.item())
        optimizer.step()
        scheduler.step()
    return torch.tensor(losses)


@pytest.mark.parametrize("name", ["llama3_rope", "qwen2_gqa"])
def test_sharded_folder_saved_by_transformers_trains_in_plait(name,
                                                              tmp_path):
    model = harness.hf_model(name)
    model.save_pretrained(tmp_path / "hf", max_shard_size="40KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    input_ids, labels = harness.make_batch(tmp_path / "batch.safetensors",
                                           model.config.vocab_size)
    harness.run_plait("train", hf_dir=tmp_path / "hf",
                      batch=tmp_path / "batch.safetensors",
                      optimizer=PLAIT_OPTIMIZER, schedule=PLAIT_SCHEDULE,
                      out=tmp_path / "plait.safetensors",
                      save_dir=tmp_path / "trained")
    plait = load_file(str(tmp_path / "plait.safetensors"))

    # transformers trains a copy in fp32, as plait does, and one in fp64, the
    # reference for the parameters (below).
    model64 = copy.deepcopy(model).double()
    losses = train_in_transformers(model, input_ids, labels)
    train_in_transformers(model64, input_ids, labels)
    check = f"transformers folder trained in plait {name}"
    harness.expect_close(f"{check}: losses", "losses", plait["loss"], losses)

    # Adam divides each gradient element by its own running magnitude, so an
    # element whose gradient is near zero moves by up to the learning rate on
    # the last bits of fp32 rounding: after a few steps two fp32 runs differ
    # by far more than 1e-5 (transformers' own fp32 run is up to ~1e-3 away
    # from its fp64 run). Which tensor the rounding hits hardest depends on the
    # order of the sums, which differs between BLAS libraries (OpenBLAS under
    # LibTorch 1.13, MKL under 2.13; seen: 1.8e-4 in one tensor under 2.13
    # where transformers' fp32 run strays at most 6.3e-5). So plait's
    # parameters are held to the fp64 run: no farther from it than four times
    # the farthest that transformers' fp32 run strays in any tensor, or 1e-5;
    # the losses above are the tight check.
    params64 = {name: param.detach()
                for name, param in model64.named_parameters()}
    hf_worst = 0.0
    for param_name, param in model.named_parameters():
        hf_error = harness.relative_error(param.detach(), params64[param_name])
        harness.record(f"{check}: transformers fp32 parameters vs fp64",
                       hf_error)
        hf_worst = max(hf_worst, hf_error)
    for param_name, reference in params64.items():
        harness.expect_close(
            f"{check}: plait parameters vs fp64", param_name,
            plait[f"param.{param_name}"], reference,
            tolerance=max(harness.FP32_TOLERANCE, 4 * hf_worst))

    # What plait saved after training loads in transformers as exactly what
    # it trained.
    trained = load_in_transformers(tmp_path / "trained")
    for param_name, param in trained.named_parameters():
        assert torch.equal(param.detach(), plait[f"param.{param_name}"]), (
            param_name)
