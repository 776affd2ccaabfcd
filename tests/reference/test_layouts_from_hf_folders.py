"""The shipped layouts whose ranks hold parts of the model start from a folder
transformers saved: the pipelines llama_pp and llama_3d, expert parallelism
(qwen3_moe_ep), context parallelism (llama_long, on a shorter sequence) and
LoRA over a pipeline. Each job, run by //trainer:train from the folder, logs
the first 10 losses of the run of one process started from the same folder,
within 1e-5 relative: each rank reads the tensors of what it holds."""

import json
import os
import re
import subprocess

import pytest
import torch
import transformers

import harness

TRAIN = os.environ["PLAIT_TRAIN_PLAN"]
EXAMPLES = os.environ["PLAIT_EXAMPLES"]
STEPS = 10
LORA = ('prepare { lora { rank: 4 alpha: 8 target: "*q_proj" '
        'target: "*down_proj" } }\n')


def train(plan_text, tmp_path, name, hf_dir, extra=()):
    """Runs the plan `plan_text` from the folder hf_dir for STEPS steps in
    fp32, one compute thread a rank; the loss of each step."""
    plan = tmp_path / f"{name}.textproto"
    plan.write_text(plan_text)
    metrics = tmp_path / f"{name}.jsonl"
    settings = {"hf_weights_dir": hf_dir, "model.dtype": "DTYPE_FLOAT32",
                "training.steps": STEPS, "training.log_every": 1,
                "training.eval_every": 0, "training.metrics_file": metrics,
                "training.run_dir": tmp_path / f"{name}_runs",
                "training.compute_threads_per_rank": 1, **dict(extra)}
    result = subprocess.run(
        [TRAIN, f"--plan={plan}"]
        + [f"--set={key}={value}" for key, value in settings.items()],
        capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, (
        f"{name} exited with {result.returncode}:\n{result.stdout}"
        f"{result.stderr}")
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return torch.tensor([row["loss"] for row in rows], dtype=torch.float64)


def one_process(plan_text):
    """The plan as one process runs it: without its top-level mesh and the
    prepare steps on it (LoRA's stays)."""
    kept, dropping, depth = [], False, 0
    for line in plan_text.splitlines(keepends=True):
        code = line.split("#", 1)[0]
        if depth == 0:
            dropping = (re.match(r"(mesh|prepare) \{", code) is not None
                        and "lora" not in code)
        depth += code.count("{") - code.count("}")
        if not dropping:
            kept.append(line)
    return "".join(kept)


def field(plan_text, name, default):
    """The integer field `name` of the plan's text, or default."""
    found = re.search(rf"^\s*{name}: (\d+)", plan_text, re.MULTILINE)
    return int(found.group(1)) if found else default


def saved_by_transformers(plan_text, tmp_path, name, alone):
    """A folder transformers saved (sharded) of the model the plan names: its
    config.json as plait writes it for the plan, weights drawn by torch."""
    plan_only = tmp_path / f"{name}_config"
    train(one_process(plan_text), tmp_path, f"{name}_config", "",
          {**alone, "training.steps": 1, "schedule.warmup.steps": 1,
           "training.save_hf_dir": plan_only})
    config = transformers.AutoConfig.from_pretrained(plan_only)
    model = transformers.AutoModelForCausalLM.from_config(config).float()
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.1 * noise if param_name.endswith("norm.weight")
                        else 0.05 * noise)
    folder = tmp_path / f"{name}_hf"
    model.save_pretrained(folder, max_shard_size="2MB")
    assert (folder / "model.safetensors.index.json").exists()
    return folder


def expect_one_process_losses(plan_text, tmp_path, name, extra=()):
    # One process reads the global batch in the plan's micro-batches.
    batch = field(plan_text, "global_batch", 1)
    micro_batches = field(plan_text, "grad_accumulation", 1)
    alone = {"training.micro_batch": batch // micro_batches, **dict(extra)}
    hf_dir = saved_by_transformers(plan_text, tmp_path, name, alone)
    layout = train(plan_text, tmp_path, name, hf_dir, extra)
    one = train(one_process(plan_text), tmp_path, f"{name}_one_process",
                hf_dir, alone)
    assert len(layout) == STEPS
    harness.expect_close(f"{name} from a transformers folder: losses",
                         "losses", layout, one)


def example(name):
    with open(os.path.join(EXAMPLES, f"{name}.textproto")) as plan:
        return plan.read()


@pytest.mark.parametrize("name", ["llama_pp", "llama_3d", "qwen3_moe_ep"])
def test_shipped_layout_starts_from_a_transformers_folder(name, tmp_path):
    expect_one_process_losses(example(name), tmp_path, name)


def test_context_parallelism_starts_from_a_transformers_folder(tmp_path):
    expect_one_process_losses(example("llama_long"), tmp_path, "llama_long",
                              {"training.seq_len": 512})


def test_lora_over_a_pipeline_starts_from_a_transformers_folder(tmp_path):
    expect_one_process_losses(example("llama_pp") + LORA, tmp_path,
                              "llama_pp_lora")
