"""`[watchdog] straggler`, `straggler_action` and `sampling`: each bad value refused naming the
file and key, and `sampling = false` reaching every process of a run as FLEET_SAMPLING=0."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.backends.slurm import cluster as slurm
from fleet.backends.slurm import script as slurm_script
from fleet.config.inventory import Host
from fleet.config.job import load_job
from fleet.config.watchdog import StragglerAction, Watchdog
from fleet.errors import ConfigError
from fleet.nodeside.shared.nodemap import SAMPLING_VAR
from tests.unit.test_config import job_file
from tests.unit.test_launchers import plan_of
from tests.unit.test_slurm import cluster_inv
from tests.unit.test_slurm import job_file as slurm_job_file

RESTART = "[restart]\nmax = 2\n"


@pytest.mark.parametrize("body, key, message", [
    ("[watchdog]\nstraggler = 1\n", "watchdog.straggler", "a factor above 1"),
    ("[watchdog]\nstraggler = 0.8\n", "watchdog.straggler", "not 0.8"),
    ("[watchdog]\nstraggler = -2\n", "watchdog.straggler", "a factor above 1"),
    ("[watchdog]\nstraggler = 11\n", "watchdog.straggler", "at most 10"),
    ("[watchdog]\nstraggler = inf\n", "watchdog.straggler", "not inf"),
    ("[watchdog]\nstraggler = nan\n", "watchdog.straggler", "not nan"),
    ('[watchdog]\nstraggler = "1.3"\n', "watchdog.straggler", "must be a number"),
    ("[watchdog]\nstraggler = true\n", "watchdog.straggler", "must be a number"),
    ('[watchdog]\nstraggler = 1.3\nstraggler_action = "kill"\n',
     "watchdog.straggler_action", "must be one of \"warn\", \"replace\", not 'kill'"),
    ("[watchdog]\nstraggler = 1.3\nstraggler_action = 1\n", "watchdog.straggler_action",
     "must be a string"),
    ('[watchdog]\nstraggler_action = "warn"\n', "watchdog.straggler_action",
     "only used with straggler"),
    ('[watchdog]\nstraggler = 1.3\nstraggler_action = "replace"\n',
     "watchdog.straggler_action", "needs [restart] with max above 0"),
    ('[watchdog]\nstraggler = 1.3\nstraggler_action = "replace"\n[restart]\nmax = 0\n',
     "watchdog.straggler_action", "needs [restart] with max above 0"),
    ("[watchdog]\nsampling = 0\n", "watchdog.sampling", "true or false"),
    ('[watchdog]\nsampling = "no"\n', "watchdog.sampling", "true or false"),
    ("[watchdog]\nstraggler = 1.3\nsampling = false\n", "watchdog.sampling",
     "turns off the ranks' sampling that straggler is judged from"),
    ("[watchdog]\nstragler = 1.3\n", "watchdog.stragler", "unknown key"),
])
def test_bad_straggler_settings_name_the_file_and_key(tmp_path: Path, body: str, key: str,
                                                      message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_job(job_file(tmp_path, body))
    assert e.value.key == key and message in str(e.value)
    assert e.value.path == str(tmp_path / "job.toml")


def test_straggler_settings_and_their_defaults(tmp_path: Path) -> None:
    plain = load_job(job_file(tmp_path)).watchdog
    assert plain.straggler is None and plain.sampling  # off, the sampling on, by default
    assert plain.straggler_action is StragglerAction.WARN
    on = load_job(job_file(tmp_path, "[watchdog]\nstraggler = 1.5\n")).watchdog
    assert on.straggler == 1.5 and on.straggler_action is StragglerAction.WARN
    two = load_job(job_file(tmp_path, "[watchdog]\nstraggler = 2\n")).watchdog
    assert two.straggler == 2.0 and isinstance(two.straggler, float)
    replace = load_job(job_file(tmp_path, '[watchdog]\nstraggler = 1.3\nstraggler_action = '
                                          f'"replace"\n{RESTART}')).watchdog
    assert replace.straggler_action is StragglerAction.REPLACE
    off = load_job(job_file(tmp_path, "[watchdog]\nsampling = false\n")).watchdog
    assert not off.sampling and off.straggler is None


def test_sampling_off_reaches_every_process_and_on_adds_nothing() -> None:
    hosts = [Host("a", "10.0.0.1"), Host("b", "10.0.0.2", env={SAMPLING_VAR: "1"})]
    off = plan_of(hosts, watchdog=Watchdog(sampling=False))
    assert [n.env[SAMPLING_VAR] for n in off.nodes] == ["0", "0"]  # a host's own does not win
    on = plan_of([Host("a", "10.0.0.1")], watchdog=Watchdog(straggler=1.3))
    assert SAMPLING_VAR not in on.nodes[0].env  # a rank samples unless told


def test_slurm_refuses_the_straggler_watch_and_passes_sampling_off(tmp_path: Path) -> None:
    cluster_inv(tmp_path)
    job = load_job(slurm_job_file(tmp_path, "[watchdog]\nstraggler = 1.3\n"))
    with pytest.raises(ConfigError) as e:
        slurm_script.export_script(job, slurm.cluster_for(job.inventory))
    assert e.value.key == "watchdog.straggler" and "not wired on Slurm" in str(e.value)
    off = load_job(slurm_job_file(tmp_path, "[watchdog]\nsampling = false\n"))
    env = slurm_script.env_of(off, slurm.cluster_for(off.inventory))
    assert env[SAMPLING_VAR] == "0"
    assert SAMPLING_VAR not in slurm_script.env_of(job, slurm.cluster_for(job.inventory))
