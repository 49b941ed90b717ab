"""States are types: each word fleet reads (a file, a record, a node) is parsed once into its
type, with an error naming where it came from; each is written out as the same word as before,
so records already on disk load and are written again byte for byte."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from pathlib import Path

import pytest

from fleet import backends
from fleet.backends.base import Final
from fleet.backends.slurm import jobs as slurm_jobs
from fleet.config.inventory import Host, load_inventory
from fleet.config.job import load_job
from fleet.config.procs import Procs, parse_nproc
from fleet.console import Console
from fleet.errors import ConfigError, DamagedRecord, ExitCode, JobFailed, RunStopped
from fleet.facts.leases import LeaseAction, LeaseOrder
from fleet.lifecycle import attempts, notify, runner
from fleet.lifecycle.monitor import RunState
from fleet.nodeside import notify_watch
from fleet.reports import Stopped
from fleet.run import record as state
from fleet.states import RunStatus


# ---- RunStatus.exit_code is fleet's ExitCode ---------------------------------------------------
def test_run_status_exit_codes_are_exit_codes() -> None:
    codes = {s: s.exit_code for s in RunStatus}
    assert all(isinstance(c, ExitCode) for c in codes.values())
    assert codes == {RunStatus.STARTING: ExitCode.OK, RunStatus.RUNNING: ExitCode.OK,
                     RunStatus.SUCCEEDED: ExitCode.OK, RunStatus.FAILED: ExitCode.FAILED,
                     RunStatus.STOPPED: ExitCode.STOPPED, RunStatus.UNKNOWN: ExitCode.UNREACHABLE,
                     RunStatus.NEVER_STARTED: ExitCode.FAILED}
    assert [int(codes[s]) for s in (RunStatus.FAILED, RunStatus.UNKNOWN, RunStatus.STOPPED)] == \
        [1, 3, 4]


# ---- Attempt.status ------------------------------------------------------------------------------
# attempts.json as fleet wrote it before its status was a type (json.dumps(..., indent=2)).
ATTEMPTS = """{
  "max": 2,
  "attempts": [
    {
      "number": 1,
      "run_id": "r",
      "hosts": [
        "n1",
        "n2"
      ],
      "started": 1.0,
      "ended": 2.0,
      "status": "failed",
      "why": "n2 was lost",
      "stopped_at": 1.5,
      "progressed_at": 1.2,
      "replaced": {
        "n2": "s1"
      },
      "then": "",
      "lost": [
        "n2"
      ]
    },
    {
      "number": 2,
      "run_id": "r-a2",
      "hosts": [
        "n1",
        "s1"
      ],
      "started": 3.0,
      "ended": 4.0,
      "status": "succeeded",
      "why": "",
      "stopped_at": null,
      "progressed_at": 3.5,
      "replaced": {},
      "then": "",
      "lost": []
    }
  ]
}
"""
INV = '[[hosts]]\nname = "n1"\naddress = "10.0.0.1"\n'


def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> state.RunRecord:
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "state"))
    rec = state.RunRecord("r", "j", 0.0, ())
    rec.dir.mkdir(parents=True)
    (rec.dir / attempts.FILE).write_text(text)
    return rec


def test_old_attempts_load_as_types_and_are_written_byte_for_byte(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = recorded(tmp_path, monkeypatch, ATTEMPTS)
    found = attempts.load(rec)
    assert found is not None
    assert [a.status for a in found[1]] == [RunStatus.FAILED, RunStatus.SUCCEEDED]
    assert attempts.as_json(rec) == json.loads(ATTEMPTS)  # `fleet status --json` too
    assert attempts.lines(*found)[0].startswith("  attempt 1/3 (r): failed, n2 was lost")

    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "inv.toml").write_text(INV)
    (tmp_path / "job.toml").write_text('inventory = "inv.toml"\nscript = "train.py"\n'
                                       "[restart]\nmax = 2\n")
    job = load_job(tmp_path / "job.toml")
    book = attempts.Book(job, job.restart, Console(out=io.StringIO(), err=io.StringIO()),
                         backends.for_inventory(job.inventory))
    book.run_id, book.attempts = "r", found[1]
    (rec.dir / attempts.FILE).unlink()
    book.save()
    assert (rec.dir / attempts.FILE).read_text() == ATTEMPTS


def test_a_recorded_attempt_gets_the_run_status_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "inv.toml").write_text(INV)
    (tmp_path / "job.toml").write_text('inventory = "inv.toml"\nscript = "train.py"\n'
                                       "[restart]\nmax = 1\n")
    job = load_job(tmp_path / "job.toml")
    book = attempts.Book(job, job.restart, Console(out=io.StringIO(), err=io.StringIO()),
                         backends.for_inventory(job.inventory))

    class Ran:
        run_id = book.run_id

        def progressed(self) -> float | None:
            return 1.0

    book.record(Ran(), Final(RunStatus.STOPPED), RunState({}, False, None),  # type: ignore[arg-type]
                None, 0.0, 1.0)
    book.record(Ran(), Final(RunStatus.SUCCEEDED), RunState({}, False, None),  # type: ignore[arg-type]
                "a hang", 2.0, 3.0)
    assert [a.status for a in book.attempts] == [RunStatus.STOPPED, RunStatus.FAILED]
    assert book.summary() == "attempts: 1/2 stopped, 2/2 failed (a hang)"


@pytest.mark.parametrize("word", ["done", "FAILED", "", 3, None])
def test_a_damaged_attempt_status_names_the_file_and_the_word(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, word: object) -> None:
    data = json.loads(ATTEMPTS)
    data["attempts"][1]["status"] = word
    rec = recorded(tmp_path, monkeypatch, json.dumps(data))
    with pytest.raises(DamagedRecord) as e:
        attempts.load(rec)
    said = str(e.value)
    assert said.startswith(f"{rec.dir / attempts.FILE}: the attempts of run r are damaged")
    assert f"attempt 2's status {word!r} is none of starting, running, succeeded" in said


# ---- notify's states ---------------------------------------------------------------------------
def test_notice_states_are_the_words_on_the_wire() -> None:
    assert [s.value for s in notify.NoticeState] == \
        ["succeeded", "failed", "hung", "stopped", "unknown"]
    n = notify.Notice("r", "j", notify.NoticeState.HUNG, 61.0, "run r hung")
    assert notify.headline(n) == "fleet: run r (j) hung after 1m 01s"
    assert notify.env(n)["FLEET_STATE"] == "hung"
    from fleet.config.notify import Format
    body = json.loads(notify.request("http://x/", Format.JSON, n).data)  # type: ignore[arg-type]
    assert body["state"] == "hung"


def test_the_watchers_words_are_notice_states(tmp_path: Path) -> None:
    """The node-side watcher speaks the same words (it cannot import fleet): each of its
    verdicts is one of NoticeState's."""
    proof = hashlib.sha256(b"fleet stop").hexdigest()
    cfg = {"node": "n1", "run_id": "r", "job": "j", "proof": proof}
    words = set()
    for code, stopped in (("0", ""), ("1", ""), ("", ""), ("143", "fleet stop\n")):
        d = tmp_path / f"c{code or 'none'}"
        d.mkdir()
        (d / "started").write_text("0")
        if code:
            (d / "exit_code").write_text(code)
        if stopped:
            (d / "stopped").write_text(stopped)
        words.add(notify_watch.verdict(str(d), cfg)[0])
    # HUNG is the laptop's alone: the watcher has no watchdog.
    assert {notify.NoticeState(w) for w in words} == set(notify.NoticeState) - {
        notify.NoticeState.HUNG}


class FakeRun:
    run_id = "r"

    def halted(self) -> Stopped:
        return Stopped("r")


@pytest.mark.parametrize(("status", "hang", "state", "error"), [
    (RunStatus.SUCCEEDED, None, notify.NoticeState.SUCCEEDED, None),
    (RunStatus.FAILED, None, notify.NoticeState.FAILED, JobFailed),
    (RunStatus.STOPPED, None, notify.NoticeState.STOPPED, RunStopped),
    (RunStatus.UNKNOWN, None, notify.NoticeState.UNKNOWN, JobFailed),
    (RunStatus.SUCCEEDED, "rank 0 is stuck", notify.NoticeState.HUNG, JobFailed),
])
def test_conclude_tells_the_state_as_a_type(status: RunStatus, hang: str | None,
                                            state: notify.NoticeState,
                                            error: type[Exception] | None) -> None:
    told = notify.Told("j", 0.0, run_id="r")
    ended = runner.Ended(FakeRun(), Final(status), RunState({}, False, None),  # type: ignore[arg-type]
                         hang, 0.0, 1.0)
    console = Console(out=io.StringIO(), err=io.StringIO())
    if error is None:
        assert runner.conclude(ended, console, told) == "r"
    else:
        with pytest.raises(error) as e:
            runner.conclude(ended, console, told)
        if status is RunStatus.UNKNOWN:
            assert e.value.exit_code is ExitCode.UNREACHABLE  # type: ignore[attr-defined]
    assert told.state is state


# ---- LeaseOrder.action -------------------------------------------------------------------------
def test_lease_orders_say_lease_py_words() -> None:
    assert LeaseOrder.take((0, 2), 3600.4, "eval").argv("me@box") == \
        ["take", "0,2", "3600", "eval", "me@box"]
    assert LeaseOrder.take(None, 60).action is LeaseAction.TAKE
    assert LeaseOrder.give(None).argv("me@box") == ["give", "all"]
    assert LeaseOrder.give((1,)).action is LeaseAction.GIVE
    order = LeaseOrder.drop(("1-0123456789ab.lease",))
    assert order.action is LeaseAction.DROP
    assert order.argv("me@box") == ["drop", "1-0123456789ab.lease"]


# ---- nproc_per_node --------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "expected"), [
    (1, 1), (8, 8), ("gpu", Procs.GPU), ("cpu", Procs.CPU), ("auto", Procs.AUTO)])
def test_nproc_words_parse(value: object, expected: object) -> None:
    got = parse_nproc(value)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(("value", "words"), [
    ("gpus", "must be a positive integer or one of gpu, cpu, auto, not 'gpus'"),
    ("GPU", "must be a positive integer or one of gpu, cpu, auto, not 'GPU'"),
    (0, "must be at least 1, not 0"),
    (-2, "must be at least 1, not -2"),
    (True, "must be a positive integer or one of gpu, cpu, auto, not True"),
    (2.5, "must be a positive integer or one of gpu, cpu, auto, not 2.5"),
])
def test_a_bad_nproc_says_why(value: object, words: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_nproc(value)
    assert str(e.value) == words
    with pytest.raises(ValueError) as e:
        parse_nproc(value, "nproc")
    assert str(e.value) == f"nproc {words}"


def test_nproc_in_files_parses_once_and_names_file_and_key(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "inv.toml").write_text(INV + 'nproc_per_node = "auto"\n')
    job_toml = tmp_path / "job.toml"
    job_toml.write_text('inventory = "inv.toml"\nscript = "train.py"\nnproc_per_node = "gpu"\n')
    assert load_job(job_toml).nproc_per_node is Procs.GPU
    assert load_inventory(tmp_path / "inv.toml").hosts[0].nproc_per_node is Procs.AUTO
    job_toml.write_text('inventory = "inv.toml"\nscript = "train.py"\nnproc_per_node = "gpus"\n')
    with pytest.raises(ConfigError) as e:
        load_job(job_toml)
    assert str(e.value) == (f"{job_toml}: nproc_per_node: must be a positive integer or one of "
                            "gpu, cpu, auto, not 'gpus'")
    (tmp_path / "inv.toml").write_text(INV + "nproc_per_node = 0\n")
    with pytest.raises(ConfigError) as e:
        load_inventory(tmp_path / "inv.toml")
    assert "nproc_per_node" in str(e.value) and "must be at least 1, not 0" in str(e.value)


def test_nproc_words_go_out_as_before() -> None:
    """torchrun's command line, the manifest, plan --json and slurm.json: the word itself."""
    assert str(Procs.GPU) == f"{Procs.GPU}" == "gpu"
    assert json.dumps({"nproc": Procs.AUTO}) == '{"nproc": "auto"}'


@pytest.mark.parametrize("nproc", ["gpu", 4])
def test_an_old_slurm_record_loads_and_is_written_byte_for_byte(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nproc: object) -> None:
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "state"))
    old = slurm_jobs.SlurmRecord("r", "job.toml", Host("login", "10.0.0.9"), "/shared/r",
                                 "42", nproc)  # type: ignore[arg-type]  # as read before
    text = json.dumps(dataclasses.asdict(old), indent=2) + "\n"
    rec = state.RunRecord("r", "j", 0.0, ())
    rec.dir.mkdir(parents=True)
    (rec.dir / slurm_jobs.RECORD).write_text(text)
    loaded = slurm_jobs.load(rec)
    assert loaded.nproc == nproc and (loaded.nproc is Procs.GPU or isinstance(loaded.nproc, int))
    assert json.dumps(dataclasses.asdict(loaded), indent=2) + "\n" == text


def test_a_damaged_slurm_record_nproc_names_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "state"))
    rec = state.RunRecord("r", "j", 0.0, ())
    rec.dir.mkdir(parents=True)
    data = {"run_id": "r", "job": "j", "login": {"name": "login", "address": "10.0.0.9"},
            "run_dir": "/shared/r", "nproc": "many"}
    (rec.dir / slurm_jobs.RECORD).write_text(json.dumps(data))
    with pytest.raises(DamagedRecord) as e:
        slurm_jobs.load(rec)
    assert str(e.value) == (f"{rec.dir / slurm_jobs.RECORD}: the record of run r is damaged "
                            "(nproc must be a positive integer or one of gpu, cpu, auto, "
                            "not 'many')")


# ---- fault points (FLEET_FAULT) -----------------------------------------------------------------
def test_a_fault_word_is_parsed_and_a_typo_fails_loudly(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    from fleet.run import faults
    monkeypatch.setenv("FLEET_FAULT", "upload:raise")
    faults.point("connect")  # another phase: nothing
    with pytest.raises(RuntimeError, match="injected fault at upload"):
        faults.point("upload")
    monkeypatch.setenv("FLEET_FAULT", "upload:kil")
    with pytest.raises(RuntimeError) as e:
        faults.point("upload")
    assert str(e.value) == ("FLEET_FAULT='upload:kil': 'kil' is none of kill, int, int2, term, "
                            "raise, pause")
    (tmp_path / "go").touch()
    monkeypatch.setenv("FLEET_FAULT", "upload:pause")
    monkeypatch.setenv("FLEET_FAULT_RESUME", str(tmp_path / "go"))
    faults.point("upload")  # said so, and went on at once: the file is there


def test_check_reads_the_gpu_word_as_a_type() -> None:
    """`fleet check`: nproc_per_node = "gpu" (parsed from the file) on a node without GPUs."""
    from fleet.backends.checks import Status
    from fleet.backends.hosts.check import _node_checks
    from fleet.facts.probe import Health

    def gpus(nproc: object, seen: int) -> tuple[Status, str]:
        c = _node_checks("n1", "n1", Health(gpus=seen, resolves=("10.0.0.1",)), 0.0,
                         parse_nproc(nproc), alone=True)[0]
        return c.status, c.detail

    assert gpus("gpu", 0) == (Status.FAIL, 'nproc_per_node = "gpu" but no GPU is visible')
    assert gpus("gpu", 2) == (Status.PASS, "2 GPU(s)")
    assert gpus(4, 2) == (Status.FAIL, "4 processes for 2 GPU(s)")
    assert gpus("auto", 0) == (Status.PASS, "none (Gloo on CPU)")
