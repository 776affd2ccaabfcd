"""plait's learning-rate schedules (sched/) against transformers'
get_scheduler, and PyTorch's StepLR, MultiStepLR and ExponentialLR, at every
step of a run."""

import math
import warnings

import pytest
import torch
import transformers

import harness

PEAK_LR = 3e-4
TOTAL_STEPS = 40
# Both sides compute in double; they differ only in the order of operations.
TOLERANCE = 1e-12


def hf(name, warmup=0, **kwargs):
    """A get_scheduler call, as a function of the optimizer."""
    def make(optimizer):
        return transformers.get_scheduler(
            name, optimizer, num_warmup_steps=warmup,
            num_training_steps=TOTAL_STEPS, scheduler_specific_kwargs=kwargs)
    return make


def torch_scheduler(scheduler_class, *args):
    return lambda optimizer: scheduler_class(optimizer, *args)


# Each case: plait's ScheduleConfig (less lr and total_steps), and the
# scheduler that should equal it.
CASES = {
    "constant": ("constant {}", hf("constant")),
    "constant_with_warmup": ("warmup { steps: 7 } constant_with_warmup {}",
                             hf("constant_with_warmup", 7)),
    "linear": ("warmup { steps: 7 } linear {}", hf("linear", 7)),
    # The Trainer makes warmup_ratio ceil(ratio * total steps) steps.
    "linear_warmup_ratio": ("warmup { ratio: 0.13 } linear {}",
                            hf("linear", math.ceil(0.13 * TOTAL_STEPS))),
    "cosine": ("warmup { steps: 5 } cosine {}", hf("cosine", 5)),
    "cosine_cycles": ("warmup { steps: 5 } cosine { num_cycles: 0.75 }",
                      hf("cosine", 5, num_cycles=0.75)),
    "cosine_with_restarts": (
        "warmup { steps: 4 } cosine_with_restarts { num_cycles: 3 }",
        hf("cosine_with_restarts", 4, num_cycles=3)),
    "cosine_with_min_lr": (
        "warmup { steps: 5 } cosine_with_min_lr { min_lr: 1e-5 }",
        hf("cosine_with_min_lr", 5, min_lr=1e-5)),
    "cosine_with_min_lr_rate": (
        "warmup { steps: 5 } cosine_with_min_lr { min_lr_rate: 0.1 }",
        hf("cosine_with_min_lr", 5, min_lr_rate=0.1)),
    "polynomial": ("warmup { steps: 6 } polynomial {}",
                   hf("polynomial", 6)),
    "polynomial_power": (
        "warmup { steps: 6 } polynomial { power: 2 lr_end: 1e-5 }",
        hf("polynomial", 6, power=2.0, lr_end=1e-5)),
    "inverse_sqrt": ("warmup { steps: 5 } inverse_sqrt {}",
                     hf("inverse_sqrt", 5)),
    "inverse_sqrt_timescale": (
        "warmup { steps: 5 } inverse_sqrt { timescale: 12 }",
        hf("inverse_sqrt", 5, timescale=12)),
    "warmup_stable_decay": (
        "warmup { steps: 5 } warmup_stable_decay { decay_steps: 10 "
        "min_lr_ratio: 0.1 }",
        hf("warmup_stable_decay", 5, num_decay_steps=10, min_lr_ratio=0.1)),
    # Warm up along a cosine, stay 20 steps, decay linearly over 10, then
    # hold the floor.
    "warmup_stable_decay_shapes": (
        "warmup { steps: 5 shape: SHAPE_COSINE } warmup_stable_decay { "
        "stable_steps: 20 decay_steps: 10 decay_shape: SHAPE_LINEAR "
        "min_lr_ratio: 0.2 }",
        hf("warmup_stable_decay", 5, num_stable_steps=20, num_decay_steps=10,
           warmup_type="cosine", decay_type="linear", min_lr_ratio=0.2)),
    "warmup_stable_decay_1_sqrt": (
        "warmup { steps: 4 shape: SHAPE_ONE_MINUS_SQRT } warmup_stable_decay "
        "{ decay_ratio: 0.25 decay_shape: SHAPE_ONE_MINUS_SQRT }",
        hf("warmup_stable_decay", 4, num_decay_steps=10, warmup_type="1-sqrt",
           decay_type="1-sqrt")),
    "step": ("step { step_size: 7 gamma: 0.5 }",
             torch_scheduler(torch.optim.lr_scheduler.StepLR, 7, 0.5)),
    "multistep": ("multistep { milestones: [10, 25] gamma: 0.3 }",
                  torch_scheduler(torch.optim.lr_scheduler.MultiStepLR,
                                  [10, 25], 0.3)),
    "exponential": ("exponential { gamma: 0.95 }",
                    torch_scheduler(torch.optim.lr_scheduler.ExponentialLR,
                                    0.95)),
}


def reference_lrs(make_scheduler):
    """The learning rate of steps 0 .. TOTAL_STEPS under a PyTorch
    scheduler."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)],
                                lr=PEAK_LR)
    lrs = []
    with warnings.catch_warnings():
        # scheduler.step() without optimizer.step(); WSD given both lengths.
        warnings.simplefilter("ignore")
        scheduler = make_scheduler(optimizer)
        for _ in range(TOTAL_STEPS + 1):
            lrs.append(optimizer.param_groups[0]["lr"])
            scheduler.step()
    return torch.tensor(lrs, dtype=torch.float64)


@pytest.fixture(scope="module")
def plait_lrs(tmp_path_factory):
    """plait's learning rates for every case, from one run of
    plait_reference."""
    folder = tmp_path_factory.mktemp("schedules")
    names = sorted(CASES)
    with open(folder / "configs.txt", "w") as f:
        for name in names:
            f.write(f"lr: {PEAK_LR} total_steps: {TOTAL_STEPS} "
                    f"{CASES[name][0]}\n")
    harness.run_plait("schedules", configs=folder / "configs.txt",
                      out=folder / "lrs.txt")
    with open(folder / "lrs.txt") as f:
        rows = [[float(value) for value in line.split()] for line in f]
    return {name: torch.tensor(row, dtype=torch.float64)
            for name, row in zip(names, rows)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_schedule_matches_pytorch(case, plait_lrs):
    harness.expect_close(f"schedule {case}", "learning rates",
                         plait_lrs[case], reference_lrs(CASES[case][1]),
                         tolerance=TOLERANCE)
