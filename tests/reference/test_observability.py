"""What a run writes for people to look at, read by the tools people use:
TensorBoard's own reader finds every number of the metrics file, under the same
name, in plait's event file (and reads a file cut short by a killed run up to
its last full event), and //tools:plot's picture of the run is XML with one
point per step."""

import json
import os
import subprocess
import xml.etree.ElementTree as ElementTree

import numpy
import pytest
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.util import tensor_util

TRAIN = os.environ["PLAIT_TRAIN"]
PLOT = os.environ["PLAIT_PLOT"]
STEPS = 6


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Trains the tiny single-process Llama for STEPS steps, once for the
    tests here; its metrics file, rows and event file."""
    tmp_path = tmp_path_factory.mktemp("run")
    metrics = tmp_path / "metrics.jsonl"
    tensorboard = tmp_path / "tensorboard"
    settings = {"training.steps": STEPS, "schedule.warmup.steps": 2,
                "training.eval_every": 3, "training.eval_batches": 1,
                "training.metrics_file": metrics,
                "training.tensorboard_dir": tensorboard,
                "training.compute_threads_per_rank": 1}
    result = subprocess.run(
        [TRAIN] + [f"--set={k}={v}" for k, v in settings.items()],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1))
    (events,) = tensorboard.glob("events.out.tfevents.*")
    return metrics, rows, events


def load(path):
    """Scalars by step and texts by tag, as TensorBoard loads them."""
    scalars, texts = {}, {}
    for event in event_file_loader.EventFileLoader(str(path)).Load():
        for value in event.summary.value:
            plugin = value.metadata.plugin_data.plugin_name
            array = tensor_util.make_ndarray(value.tensor)
            if plugin == "scalars":
                scalars.setdefault(event.step, {})[value.tag] = array.item()
            elif plugin == "text":
                texts[value.tag] = array.item().decode()
    return scalars, texts


def test_tensorboard_reads_every_number_of_the_metrics_file(run):
    _, rows, events = run
    scalars, texts = load(events)
    assert sorted(scalars) == [row["step"] for row in rows]
    for row in rows:
        expected = {name: value for name, value in row.items() if name != "step"}
        assert set(scalars[row["step"]]) == set(expected), row["step"]
        for name, value in expected.items():
            # TensorBoard's scalars are float32.
            assert scalars[row["step"]][name] == numpy.float32(value), (
                f"{name} at step {row['step']}")
    assert "eval_loss" in scalars[3] and "eval_loss" in scalars[STEPS]
    assert texts["plan"].startswith("```\n")
    assert f"steps: {STEPS}" in texts["plan"]


def test_tensorboard_reads_a_file_cut_short_up_to_its_last_full_event(
        run, tmp_path):
    _, rows, events = run
    cut = tmp_path / events.name
    cut.write_bytes(events.read_bytes()[:-5])  # into the last step's record
    scalars, _ = load(cut)
    assert sorted(scalars) == [row["step"] for row in rows[:-1]]


def test_plot_draws_a_point_per_step(run, tmp_path):
    metrics, rows, _ = run
    picture = tmp_path / "curves.svg"
    result = subprocess.run([PLOT, f"--out={picture}", str(metrics)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    svg = "{http://www.w3.org/2000/svg}"
    root = ElementTree.parse(picture).getroot()
    assert root.tag == f"{svg}svg"
    lines = {line.get("data-metric"): line.get("points").split()
             for line in root.iter(f"{svg}polyline")}
    for metric in ("loss", "lr", "grad_norm", "tokens_per_s"):
        assert len(lines[metric]) == len(rows), metric
    assert len(lines["eval_loss"]) == 2  # steps 3 and 6
    # The synthetic data's floor, from the run summary beside the metrics.
    assert any(line.get("class") == "floor" for line in root.iter(f"{svg}line"))
    # A second run of the same command replaces its own picture; no other file.
    drawn = picture.read_bytes()
    again = subprocess.run([PLOT, f"--out={picture}", str(metrics)],
                           capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert picture.read_bytes() == drawn
    notes = tmp_path / "notes.svg"
    notes.write_text("<svg>mine</svg>")
    refused = subprocess.run([PLOT, f"--out={notes}", str(metrics)],
                             capture_output=True, text=True)
    assert refused.returncode == 1
    assert "exists and plot did not write it" in refused.stderr, refused.stderr
    assert notes.read_text() == "<svg>mine</svg>"
