"""plait's Llama, Qwen2, Qwen3 and Qwen3-MoE against transformers' LlamaForCausalLM,
Qwen2ForCausalLM, Qwen3ForCausalLM and Qwen3MoeForCausalLM (its loss with the
load-balancing loss, which transformers adds with output_router_logits):
the same weights (a folder transformers saved, which plait
loads) and the same batch give the same logits, loss and gradient of every
parameter, in fp32, within 1e-5 relative."""

import pytest

import harness


@pytest.mark.parametrize("name", sorted(harness.CONFIGS))
def test_forward_backward_matches_transformers(name, tmp_path):
    model = harness.hf_model(name)
    model.save_pretrained(tmp_path / "hf")
    input_ids, labels = harness.make_batch(tmp_path / "batch.safetensors",
                                           model.config.vocab_size)
    harness.run_plait("forward_backward", hf_dir=tmp_path / "hf",
                      batch=tmp_path / "batch.safetensors",
                      out=tmp_path / "plait.safetensors")
    harness.compare_forward_backward(
        f"model {name}", tmp_path / "plait.safetensors", model, input_ids,
        labels)
