"""plait's optimizers (optim/) against torch.optim: AdamW, Adam and SGD from
the same initial parameters, on the same 20 gradients, at a learning rate that
changes every step, compared after every step within 1e-5 relative."""

import pytest
import torch
from safetensors.torch import load_file, save_file

import harness

STEPS = 20
# Parameters named as in a model, so that name rules can group them.
SHAPES = {
    "model.embed_tokens.weight": (48, 16),
    "model.layers.0.self_attn.q_proj.weight": (16, 16),
    "model.layers.0.self_attn.q_proj.bias": (16,),
    "model.norm.weight": (16,),
}
# plait's rule for the parameters is_no_decay takes.
NO_DECAY = r'regex: ".*(norm\\.weight|\\.bias)"'


def is_no_decay(name):
    return name.endswith("norm.weight") or name.endswith(".bias")


def single(params, weight_decay=0.0):
    """One torch param group of every parameter."""
    return [{"params": list(params.values()), "weight_decay": weight_decay,
             "lr_scale": 1.0}]


def split(params, weight_decay, no_decay_lr_scale=1.0):
    """torch's param groups for plait's NO_DECAY rule with weight_decay 0."""
    decay = [p for n, p in params.items() if not is_no_decay(n)]
    no_decay = [p for n, p in params.items() if is_no_decay(n)]
    return [{"params": decay, "weight_decay": weight_decay, "lr_scale": 1.0},
            {"params": no_decay, "weight_decay": 0.0,
             "lr_scale": no_decay_lr_scale}]


# Each case: plait's OptimizerConfig, and the torch optimizer class, its
# arguments, its param groups (from the parameters by name) and
# clip_grad_norm_'s max_norm (or None).
CASES = {
    "adamw": ("adamw {} weight_decay: 0.01",
              (torch.optim.AdamW, {}, lambda p: single(p, 0.01), None)),
    "adamw_groups": (
        "adamw { beta1: 0.85 beta2: 0.95 eps: 1e-6 } weight_decay: 0.1 "
        f"param_groups {{ name: 'no_decay' {NO_DECAY} weight_decay: 0 "
        "lr_scale: 0.5 }",
        (torch.optim.AdamW, {"betas": (0.85, 0.95), "eps": 1e-6},
         lambda p: split(p, 0.1, no_decay_lr_scale=0.5), None)),
    "adamw_clipped": ("adamw {} weight_decay: 0.1 clipping { max_norm: 100 }",
                      (torch.optim.AdamW, {}, lambda p: single(p, 0.1),
                       100.0)),
    "adam": ("adam {}", (torch.optim.Adam, {}, single, None)),
    "adam_l2": ("adam { beta2: 0.99 } weight_decay: 0.01",
                (torch.optim.Adam, {"betas": (0.9, 0.99)},
                 lambda p: single(p, 0.01), None)),
    "sgd": ("sgd {}", (torch.optim.SGD, {}, single, None)),
    "sgd_momentum": ("sgd { momentum: 0.9 } weight_decay: 0.001",
                     (torch.optim.SGD, {"momentum": 0.9},
                      lambda p: single(p, 0.001), None)),
    "sgd_dampening": (
        "sgd { momentum: 0.8 dampening: 0.3 } weight_decay: 0.01 "
        f"param_groups {{ name: 'no_decay' {NO_DECAY} weight_decay: 0 }}",
        (torch.optim.SGD, {"momentum": 0.8, "dampening": 0.3},
         lambda p: split(p, 0.01), None)),
    "sgd_nesterov": (
        "sgd { momentum: 0.9 nesterov: true } weight_decay: 0.01 "
        "clipping { max_norm: 100 }",
        (torch.optim.SGD, {"momentum": 0.9, "nesterov": True},
         lambda p: single(p, 0.01), 100.0)),
}


def make_inputs(folder):
    """Initial parameters, STEPS gradients of each and STEPS learning rates,
    also written for plait. Gradient scales vary by step (global norms ~32 to
    ~230), so that clipping at 100 acts on some steps and not on others."""
    generator = torch.Generator().manual_seed(0)
    params = {n: torch.randn(s, generator=generator)
              for n, s in SHAPES.items()}
    scales = 1.0 + torch.arange(STEPS) % 7
    grads = {n: torch.randn((STEPS,) + s, generator=generator)
             * scales.reshape((STEPS,) + (1,) * len(s))
             for n, s in SHAPES.items()}
    # fp32 values, so that both sides use exactly the same learning rates.
    lrs = (1e-2 * (1.0 + torch.cos(0.3 * torch.arange(STEPS)))).float()
    save_file(params, str(folder / "params.safetensors"))
    save_file({"lr": lrs, **grads}, str(folder / "grads.safetensors"))
    return params, grads, lrs


def run_torch(case, params, grads, lrs):
    """Each parameter after every step under torch.optim: [STEPS, ...]."""
    optimizer_class, kwargs, make_groups, max_norm = CASES[case][1]
    tensors = {n: p.clone().requires_grad_() for n, p in params.items()}
    optimizer = optimizer_class(make_groups(tensors), lr=1.0, **kwargs)
    trajectory = {n: [] for n in tensors}
    for step in range(STEPS):
        for name, tensor in tensors.items():
            tensor.grad = grads[name][step].clone()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(list(tensors.values()), max_norm)
        for group in optimizer.param_groups:
            group["lr"] = lrs[step].item() * group["lr_scale"]
        optimizer.step()
        for name, tensor in tensors.items():
            trajectory[name].append(tensor.detach().clone())
    return {n: torch.stack(values) for n, values in trajectory.items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The inputs, and plait's trajectories of every case from one run of
    plait_reference."""
    folder = tmp_path_factory.mktemp("optimizers")
    params, grads, lrs = make_inputs(folder)
    names = sorted(CASES)
    with open(folder / "configs.txt", "w") as f:
        for name in names:
            f.write(CASES[name][0] + "\n")
    harness.run_plait("optimizers", configs=folder / "configs.txt",
                      params=folder / "params.safetensors",
                      grads=folder / "grads.safetensors",
                      out=folder / "plait.safetensors")
    plait = load_file(str(folder / "plait.safetensors"))
    trajectories = {name: {n: plait[f"{i}.{n}"] for n in SHAPES}
                    for i, name in enumerate(names)}
    return params, grads, lrs, trajectories


@pytest.mark.parametrize("case", sorted(CASES))
def test_optimizer_matches_torch_optim(case, runs):
    params, grads, lrs, trajectories = runs
    expected = run_torch(case, params, grads, lrs)
    for name in SHAPES:
        harness.expect_close(f"optimizer {case}", name,
                             trajectories[case][name], expected[name])
