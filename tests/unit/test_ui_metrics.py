"""`[metrics]`: the patterns `fleet ui` plots per rank; each bad one refused naming the file and
key, and the shipped MNIST job's own patterns matching what it prints."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleet.config.job import load_job
from fleet.errors import ConfigError
from tests.unit.test_config import job_file

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("body, key, message", [
    ('[metrics]\nloss = "loss ([0-9.]+)"\n', "metrics.loss", "group v"),
    ('[metrics]\nloss = "loss (?P<v>[0-9.]+"\n', "metrics.loss", "not a regular expression"),
    ('[metrics]\nloss = ""\n', "metrics.loss", "1 to 300 characters"),
    ("[metrics]\nloss = 3\n", "metrics.loss", "must be a string"),
    ('[metrics]\nloss = "(?i)loss (?P<v>[0-9]+)"\n', "metrics.loss", "'(?i)'"),
    ('[metrics]\nloss = "(?P<v>[0-9]++)"\n', "metrics.loss", "'++'"),
    ('[metrics]\nloss = "\\\\A(?P<v>[0-9]+)"\n', "metrics.loss", "JavaScript"),
    ('[metrics]\n"bad name" = "(?P<v>[0-9]+)"\n', "metrics.bad name", "a metric's name"),
    ('metrics = "loss"\n', "metrics", "must be a table"),
])
def test_bad_metrics_name_the_file_and_key(tmp_path: Path, body: str, key: str,
                                           message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_job(job_file(tmp_path, body))
    assert e.value.key == key and message in str(e.value)


def test_metrics_are_kept_in_order(tmp_path: Path) -> None:
    job = load_job(job_file(tmp_path, '[metrics]\nstep_ms = "time (?P<v>[0-9.]+) ms"\n'
                                      'loss = "loss (?P<v>[0-9.]+)"\n'))
    assert list(job.metrics) == ["step_ms", "loss"]
    assert load_job(job_file(tmp_path)).metrics == {}


def test_the_mnist_jobs_patterns_match_its_lines() -> None:
    job = load_job(ROOT / "jobs" / "mnist.toml")
    loss = re.search(job.metrics["loss"], "epoch 0 batch 20/235 loss 0.5123")
    step = re.search(job.metrics["step_ms"], "step 40 time 12.5 ms")
    assert loss and loss["v"] == "0.5123" and step and step["v"] == "12.5"
    # the script prints those lines (rank 0 the loss, every rank its step time)
    script = (ROOT / "jobs" / "mnist.py").read_text()
    assert 'loss {loss.item():.4f}"' in script and 'print(f"step {step} time ' in script
