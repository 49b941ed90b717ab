"""`fleet doctor`'s pure parts: the parsers of what the node programs print (untrusted input),
the rounds of disjoint pairs, the verdict over the figures, the inventory's [doctor] bounds;
and the node programs themselves, run here under sh as a node runs them."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet import backends
from fleet.config.doctor import Bounds
from fleet.config.inventory import load_inventory
from fleet.config.job import Job, load_job
from fleet.console import Console
from fleet.doctor import history
from fleet.doctor.figures import Examination, Link, Ring, bits_words, time_words
from fleet.doctor.pairs import disjoint, rounds
from fleet.doctor.report import as_json, summary
from fleet.doctor.verdict import disk_suspects, judge, named_hosts, suspects
from fleet.errors import ConfigError, HostError
from fleet.facts.gpuhealth import (
    FIELDS,
    GPU_HEALTH_SCRIPT,
    GpuHealth,
    GpuHealthFacts,
    parse_gpu_health,
)
from fleet.facts.hostfigs import HostFigures, host_script, parse_host
from fleet.facts.links import (
    Sent,
    parse_allreduce,
    parse_free_port,
    parse_send,
    parse_sink,
    send_script,
    sink_script,
)
from fleet.lifecycle import attempts, checkup
from fleet.states import RunStatus

SMI = Path(__file__).resolve().parents[1] / "fake_nvidia_smi.py"
G, M = 1e9, 1e6


# ---- parsers ---------------------------------------------------------------------------------
def test_send_parsed_and_its_rate() -> None:
    s = parse_send("rtt 80.5 60.1\nbulk 1250000000 1.000000\n")
    assert (s.rtt_us, s.rtt_min_us, s.error) == (80.5, 60.1, "")
    assert s.bits == pytest.approx(10 * G)


@pytest.mark.parametrize("out, error", [
    ("fail [Errno 111] Connection refused\n", "[Errno 111] Connection refused"),
    ("rtt 80 60\n", "the sender said nothing of the bulk transfer"),
    ("rtt 80 60\nbulk -5 1.0\n", "the sink's answer was no figure"),
    ("bulk 100 nan\n", "the sink's answer was no figure"),
    ("bulk 100 inf\n", "the sink's answer was no figure"),
    ("", "the sender said nothing of the bulk transfer"),
    ("Traceback\nboom \x1b[31m\n", "boom"),
])
def test_send_refuses_what_is_no_figure(out: str, error: str) -> None:
    s = parse_send(out)
    assert s.bits is None
    assert error in s.error and "\x1b" not in s.error


def test_send_rtt_out_of_bounds_is_none() -> None:
    assert parse_send("rtt 1e99 -3\nbulk 10 1\n").rtt_us is None


def test_sink_parsed() -> None:
    assert parse_sink("listening 4242 777\n") == (4242, 777)
    assert parse_sink("busy [Errno 98] Address in use") == "[Errno 98] Address in use"
    assert parse_sink("listening 70000 777\n") == "listening 70000 777"
    assert parse_sink("listening 4242 1\n") == "listening 4242 1"  # never pid 1
    assert parse_sink("") == "the sink did not start"


def test_host_parsed() -> None:
    f = parse_host("cores 8 16\nsteal 5 100\nthrottle 2\nmemory 1024 512\n"
                   "write 1000000 0.5\nread 2000000 0.5\nerror disk full\nnoise line\n")
    assert f == HostFigures(cores=8, steal=0.05, throttled=2, memory=1024, available=512,
                            disk_write=2e6, disk_read=4e6, errors=("disk full",))


@pytest.mark.parametrize("out", ["steal 9 5\n", "steal x 5\n", "write 10 0\n",
                                 "write 10 -1\n", "cores ² 3\n", "throttle -4\n"])
def test_host_figures_out_of_bounds_are_none(out: str) -> None:
    assert parse_host(out) == HostFigures()


def test_gpu_health_of_the_stand_in(tmp_path: Path) -> None:
    state = {"gpus": [{}, {"ecc_uncorrected": 3, "retired_pending": "Yes",
                           "throttle": "0x0000000000000048", "pcie_width": 8}]}
    (tmp_path / "s.json").write_text(json.dumps(state))
    env = {**os.environ, "TB_NVIDIA_SMI_STATE": str(tmp_path / "s.json")}
    r = subprocess.run([sys.executable, "-I", str(SMI), f"--query-gpu={','.join(FIELDS)}",
                        "--format=csv,noheader,nounits"], capture_output=True, text=True,
                       env=env, timeout=30)
    g = parse_gpu_health(f"=== gpus\n{r.stdout}=== rc {r.returncode}\nxid=2\n")
    assert g.smi and g.error == "" and g.xid == 2
    assert g.gpus[0].faults() == []
    assert g.gpus[1].faults() == ["3 uncorrected ECC errors", "retired pages pending a reset",
                                  "throttled: hardware slowdown, thermal (hardware)",
                                  "PCIe link x8 of x16"]


def test_gpu_health_odd_answers() -> None:
    assert parse_gpu_health("nvidia-smi=missing\n") == GpuHealthFacts(smi=False)
    g = parse_gpu_health("=== gpus\n0, [N/A], [N/A], [N/A], [N/A], [N/A], 4, 4, 16, 16\n"
                         "junk\n0, 1, 0, No, 0, 0x0, 4, 4, 16, 16\n=== rc 0\n")
    assert g.error == "junk; nvidia-smi listed a GPU twice" and g.gpus == ()
    g = parse_gpu_health("=== gpus\nField \"x\" is not a valid field to query.\n=== rc 2\n")
    assert g.gpus == () and "not a valid field" in g.error
    g = parse_gpu_health("=== gpus\n0, [N/A], 0, [N/A], [N/A], 0xzz, 4, 4, 16, 16\n=== rc 0\n")
    assert g.gpus[0].faults() == [] and g.gpus[0].throttle is None


# ---- the rounds ------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [*range(2, 34), 64])
def test_rounds_are_disjoint_few_and_every_host_meets_several(n: int) -> None:
    rs = rounds(n)
    assert len(rs) <= math.ceil(math.log2(n)) + 1
    seen: set[tuple[int, int]] = set()
    peers: dict[int, set[int]] = {i: set() for i in range(n)}
    for r in rs:
        hosts = [x for p in r for x in p]
        assert len(hosts) == len(set(hosts)), r  # no host twice in a round
        for a, b in r:
            assert 0 <= a < b < n and (a, b) not in seen
            seen.add((a, b))
            peers[a].add(b)
            peers[b].add(a)
    assert all(len(p) >= min(2, n - 1) for p in peers.values()), peers


def test_rounds_of_four_meet_every_peer() -> None:
    assert rounds(4) == [[(0, 1), (2, 3)], [(0, 2), (1, 3)], [(0, 3), (1, 2)]]
    assert rounds(1) == [] and rounds(0) == []


def test_disjoint_again() -> None:
    assert disjoint([("a", "b"), ("a", "c"), ("d", "e"), ("b", "c")]) == [
        [("a", "b"), ("d", "e")], [("a", "c")], [("b", "c")]]


# ---- the verdict -----------------------------------------------------------------------------
def link(a: str, b: str, bits: float, rtt: float = 80.0, error: str = "") -> Link:
    s = Sent(rtt, rtt, int(bits / 8), 1.0, error)
    return Link(a, b, s, s)


def exam(links: list[Link], n: int = 4, **hosts: HostFigures) -> Examination:
    names = [f"node{i}" for i in range(1, n + 1)] + [h for h in hosts if not h.startswith("node")]
    return Examination(hosts={h: hosts.get(h, HostFigures(cores=8, memory=64 << 30,
                                                          disk_write=1e9, disk_read=2e9,
                                                          steal=0.0)) for h in names},
                       offsets={h: 0.1 for h in names}, links=tuple(links), rounds=3)


def full_mesh(slow: dict[tuple[str, str], float], n: int = 4) -> list[Link]:
    names = [f"node{i}" for i in range(1, n + 1)]
    return [link(a, b, slow.get((a, b), 9.4 * G)) for i, a in enumerate(names)
            for b in names[i + 1:]]


def test_slow_link_common_end_named_alone() -> None:
    e = exam(full_mesh({("node1", "node4"): 60 * M, ("node2", "node4"): 48 * M,
                        ("node3", "node4"): 50 * M}))
    found = judge(e, Bounds())
    assert [f.line for f in found] == [
        "node4: link to node2 48 Mbit/s (median 9.4 Gbit/s); node4 is the common end of the 3 "
        "slow pairs"]
    assert named_hosts(found) == ["node4"]
    assert summary(e, found).endswith("1 host named: node4")


def test_one_noisy_link_pins_no_host() -> None:
    found = judge(exam(full_mesh({("node1", "node3"): 48 * M})), Bounds())
    assert named_hosts(found) == []
    assert [f.line for f in found] == [
        "node1-node3: link 48 Mbit/s (median 9.4 Gbit/s); neither end is slow with its other "
        "peers"]


def test_three_hosts_one_slow_still_named() -> None:
    # two of three pairs are slow: the median of each host's best link is still the fast one
    found = judge(exam(full_mesh({("node1", "node3"): 50 * M, ("node2", "node3"): 50 * M}, 3),
                       3), Bounds())
    assert named_hosts(found) == ["node3"]


def test_all_within_bounds_names_nothing() -> None:
    mesh = full_mesh({("node1", "node2"): 4 * G, ("node3", "node4"): 7 * G})
    e = exam(mesh)
    assert judge(e, Bounds()) == []
    assert summary(e, []).endswith("every host and link within bounds")
    assert json.loads(json.dumps(as_json(e, [])))["named"] == []


def test_failed_links_pin_their_common_end() -> None:
    mesh = full_mesh({}) + []
    mesh = [link(x.a, x.b, 0, error="Connection refused") if "node2" in (x.a, x.b) else x
            for x in mesh]
    found = judge(exam(mesh), Bounds())
    assert named_hosts(found) == ["node2"]
    assert "failed (Connection refused)" in found[0].line


def test_slow_round_trip_named() -> None:
    mesh = [link(x.a, x.b, 9 * G, 3000.0 if "node3" in (x.a, x.b) else 80.0)
            for x in full_mesh({})]
    found = judge(exam(mesh), Bounds())
    assert [f.line for f in found] == [
        "node3: round trip to node1 3 ms (median 80 µs); node3 is the common end of the 3 "
        "slow pairs"]
    # a few hundred µs more is noise, whatever the ratio
    mesh = [link(x.a, x.b, 9 * G, 400.0 if "node3" in (x.a, x.b) else 30.0)
            for x in full_mesh({})]
    assert judge(exam(mesh), Bounds()) == []


def test_hosts_figures_named_against_the_median() -> None:
    slow_disk = HostFigures(cores=8, memory=64 << 30, disk_write=20e6, disk_read=2e9,
                            steal=0.3, throttled=4)
    e = exam(full_mesh({}), node2=slow_disk)
    lines = [f.line for f in judge(e, Bounds())]
    assert lines == ["node2: disk write 20 MB/s (median 1 GB/s)",
                     "node2: 30% of its CPU time stolen by the hypervisor (bound 10%)",
                     "node2: its CPUs throttled for heat 4 times while measured"]
    assert judge(e, Bounds(disk=0.01, steal=0.5)) == [
        f for f in judge(e, Bounds()) if f.kind == "throttle"]


def test_clock_and_gpu_named() -> None:
    e = exam(full_mesh({}))
    e.offsets["node3"] = 4.2
    e.gpus["node1"] = GpuHealthFacts(True, (GpuHealth(0), GpuHealth(1, ecc_uncorrected=2)))
    lines = [f.line for f in judge(e, Bounds())]
    assert lines == ["node3: clock 4.1 s ahead of the hosts' median (bound 1 s)",
                     "node1: GPU1: 2 uncorrected ECC errors"]


def test_words() -> None:
    assert bits_words(48e6) == "48 Mbit/s" and bits_words(9.4e9) == "9.4 Gbit/s"
    assert time_words(80) == "80 µs" and time_words(3100) == "3.1 ms"


# ---- the inventory's [doctor] ------------------------------------------------------------------
INV = '[[hosts]]\nname = "a"\naddress = "10.0.0.1"\n'


def test_bounds_from_the_inventory(tmp_path: Path) -> None:
    p = tmp_path / "inv.toml"
    p.write_text(INV + "[doctor]\nlink = 0.5\nclock_skew_s = 3\n")
    assert load_inventory(p).doctor == Bounds(link=0.5, clock_skew_s=3.0)
    p.write_text(INV)
    assert load_inventory(p).doctor == Bounds()


@pytest.mark.parametrize("body, key, message", [
    ("[doctor]\nlnk = 0.5\n", "doctor.lnk", "unknown key"),
    ("[doctor]\nlink = 2\n", "doctor.link", "must be a number from 0 to 1, not 2"),
    ('[doctor]\nlink = "x"\n', "doctor.link", "must be"),
    ("doctor = 3\n", "doctor", "must be a table"),
])
def test_bounds_errors_name_file_and_key(tmp_path: Path, body: str, key: str,
                                         message: str) -> None:
    p = tmp_path / "inv.toml"
    p.write_text(body + INV if not body.startswith("[") else INV + body)
    with pytest.raises(ConfigError) as e:
        load_inventory(p)
    assert e.value.key == key and str(e.value).startswith(f"{p}: {key}: ")
    assert message in str(e.value)


# ---- the node programs, run here as a node runs them -------------------------------------------
def sh(script: str) -> str:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                          timeout=60).stdout


def test_link_test_programs_measure_and_end() -> None:
    started = parse_sink(sh(sink_script(sys.executable, 20, 1)))
    assert isinstance(started, tuple)
    port, pid = started
    sent = parse_send(sh(send_script(sys.executable, "127.0.0.1", port, "127.0.0.1", 0.2)))
    assert sent.error == "" and sent.bits and sent.rtt_us
    for _ in range(100):  # its one connection served, the sink ends by itself
        if not os.path.exists(f"/proc/{pid}") or "Z" in Path(f"/proc/{pid}/stat").read_text(
                ).rsplit(")", 1)[1].split()[:1]:
            break
        subprocess.run(["sleep", "0.05"], check=True)
    else:
        pytest.fail("the sink outlived its one connection")
    refused = parse_send(sh(send_script(sys.executable, "127.0.0.1", port, "-", 0.2)))
    assert refused.bits is None and refused.error


def test_host_program_measures_and_leaves_nothing(tmp_path: Path) -> None:
    f = parse_host(sh(host_script(sys.executable, str(tmp_path / "w"), 1 << 20, 0.1)))
    assert f.cores and f.memory and f.disk_write and f.disk_read and f.steal is not None
    assert list((tmp_path / "w").iterdir()) == []


def test_gpu_health_script_without_nvidia_smi() -> None:
    out = subprocess.run(["/bin/sh", "-c", GPU_HEALTH_SCRIPT], capture_output=True, text=True,
                         timeout=30, env={"PATH": "/nonexistent"}).stdout
    assert parse_gpu_health(out) == GpuHealthFacts(smi=False)


def test_suspects_and_a_second_measure() -> None:
    mesh = full_mesh({("node1", "node3"): 48 * M})
    mesh[0] = link("node1", "node2", 9 * G, 5000.0)
    assert suspects(mesh, Bounds()) == [("node1", "node3"), ("node1", "node2")]
    again = mesh[1].better(link("node1", "node3", 9 * G, 90.0))
    assert (again.bits, again.rtt_us) == (pytest.approx(9 * G), 80.0)
    assert mesh[1].better(link("node1", "node3", 1 * M)).bits == pytest.approx(48 * M)


# ---- history -------------------------------------------------------------------------------------
def test_history_shows_a_regression_and_stays_bounded(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "lab.toml"
    p = history.path_for(inv)
    assert p.parent == tmp_path / "state" / "doctor"
    before = exam(full_mesh({}))
    at = time.mktime((2026, 11, 20, 12, 0, 0, 0, 0, -1))
    for k in range(history.KEEP + 5):
        past = history.load(p)
        assert history.regressions(past, history.figures(before), Bounds()) == []
        assert history.keep(p, past, history.figures(before), at + k) == ""
    past = history.load(p)
    assert [len(v) for v in past.values()] == [history.KEEP] * 4
    slow = exam(full_mesh({("node1", "node4"): 48 * M, ("node2", "node4"): 48 * M,
                           ("node3", "node4"): 48 * M}))
    assert history.regressions(past, history.figures(slow), Bounds()) == [
        "node4's link: 48 Mbit/s, was 9.4 Gbit/s on 2026-11-20"]
    history.keep(p, past, history.figures(slow), at + 100)
    # slow since: still said against the last look that was fast
    again = history.regressions(history.load(p), history.figures(slow), Bounds())
    assert again == ["node4's link: 48 Mbit/s, was 9.4 Gbit/s on 2026-11-20"]


def test_history_damaged_is_started_again(tmp_path: Path) -> None:
    p = tmp_path / "h.json"
    for text in ["{", "[1]", '{"node1": 3, "node2": [1, {"at": 1}]}']:
        p.write_text(text)
        assert history.load(p) in ({}, {"node2": [{"at": 1}]})
    assert history.regressions({"node1": [{"at": 1, "figures": {"link": "x"}}]},
                               {"node1": {"link": 1.0}}, Bounds()) == []


# ---- [doctor] before, in the run's life ----------------------------------------------------------
LAB = ('[[hosts]]\nname = "n1"\naddress = "10.0.0.1"\n[[hosts]]\nname = "n2"\n'
       'address = "10.0.0.2"\n[[hosts]]\nname = "n3"\naddress = "10.0.0.3"\n'
       '[[hosts]]\nname = "s1"\naddress = "10.0.0.9"\nspare = true\n'
       '[[hosts]]\nname = "s2"\naddress = "10.0.0.8"\nspare = true\n')


class Doctored:
    """A backend that answers `doctor` from a given examination (and lists the spares)."""

    def __init__(self, found: Examination) -> None:
        self.found, self.asked = found, 0

    def doctor(self, inventory: Path, nodes: object, quick: bool, progress: object
               ) -> Examination:
        self.asked += 1
        return self.found

    def spares(self, inventory: Path) -> list[str]:
        return ["s1", "s2"]


def lab_job(tmp_path: Path, body: str) -> Job:
    (tmp_path / "inv.toml").write_text(LAB)
    (tmp_path / "t.py").write_text("print(1)\n")
    (tmp_path / "job.toml").write_text('inventory = "inv.toml"\nscript = "t.py"\n' + body)
    return load_job(tmp_path / "job.toml")


def slow_one(name: str) -> Examination:
    names = ["n1", "n2", "n3", "s1", "s2"]
    return exam([link(a, b, 48 * M if name in (a, b) else 9.4 * G)
                 for i, a in enumerate(names) for b in names[i + 1:]], 0,
                **{h: HostFigures(cores=8) for h in names})


def quiet() -> Console:
    return Console(out=io.StringIO(), err=io.StringIO())


def test_doctor_before_reads_its_word(tmp_path: Path) -> None:
    assert lab_job(tmp_path, "").doctor_before == ""
    assert lab_job(tmp_path, '[doctor]\nbefore = "quick"\n').doctor_before == "quick"
    with pytest.raises(ConfigError) as e:
        lab_job(tmp_path, '[doctor]\nbefore = "always"\n')
    assert e.value.key == "doctor.before" and 'must be "quick" or "full"' in str(e.value)
    with pytest.raises(ConfigError) as e:
        lab_job(tmp_path, '[doctor]\nbefre = "quick"\n')
    assert e.value.key == "doctor.befre"


def test_a_named_host_stops_the_launch_with_the_doctors_line(tmp_path: Path) -> None:
    job = lab_job(tmp_path, '[doctor]\nbefore = "quick"\n')
    with pytest.raises(HostError) as e:
        checkup.before_up(Doctored(slow_one("n2")), job, quiet())  # type: ignore[arg-type]
    assert e.value.exit_code == 5
    assert str(e.value).splitlines() == [
        "fleet doctor before the launch failed on 1 host(s); nothing was started:",
        "  n2: link to n1 48 Mbit/s (median 9.4 Gbit/s); n2 is the common end of the 4 slow "
        "pairs"]
    c = quiet()
    checkup.before_up(Doctored(slow_one("s1")), job, c)  # type: ignore[arg-type]
    assert "[doctor] spare s1: link to n1 48 Mbit/s" in c.err.getvalue()  # type: ignore
    none = Doctored(slow_one("n2"))
    checkup.before_up(none, lab_job(tmp_path, ""), quiet())  # type: ignore[arg-type]
    assert none.asked == 0


def test_a_host_named_before_a_restart_gives_way_to_a_free_spare(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "state"))
    job = lab_job(tmp_path, '[doctor]\nbefore = "quick"\n[restart]\nmax = 2\n')
    c = quiet()
    book = attempts.Book(job, job.restart, c, backends.for_inventory(job.inventory))
    book.attempts.append(attempts.Attempt(1, book.run_id, ["n1", "n2", "n3"], 1.0, 2.0,
                                          RunStatus.FAILED, "n1 failed (exit 1)"))
    # s1 is named too: never taken; n2 gets s2
    named = checkup.before_attempt(Doctored(slow_one("n2")), job, c, 2)  # type: ignore
    named["s1"] = "s1: disk write 2 MB/s (median 1 GB/s)"
    book.doctor_named(named)
    assert book.replace == {"n2": "s2"}
    book.confirm()
    assert ("restart: n2 replaced by spare s2 (fleet doctor: n2: link to n1 48 Mbit/s "
            "(median 9.4 Gbit/s); n2 is the common end of the 4 slow pairs)") in \
        c.err.getvalue()  # type: ignore[attr-defined]
    assert book.attempts[-1].replaced == {"n2": "s2"}


def test_check_says_which_checks_differ_between_hosts() -> None:
    from fleet.backends import Check, Status, differ

    checks = [Check("n1", "disk", Status.PASS, ""), Check("n2", "disk", Status.WARN, "low"),
              Check("n1", "python", Status.PASS, ""), Check("n2", "python", Status.PASS, ""),
              Check("n1", "rendezvous port", Status.FAIL, ""),
              Check("n1", "clock", Status.FAIL, ""), Check("n2", "clock", Status.FAIL, "")]
    assert differ(checks) == ["disk"]
    assert differ(checks[2:]) == []


def test_disk_suspects() -> None:
    ok = HostFigures(disk_write=1e9, disk_read=1e9)
    hosts = {"a": ok, "b": ok, "c": HostFigures(disk_write=1e9, disk_read=1e7), "d": ok}
    assert disk_suspects(hosts, Bounds()) == ["c"]
    assert disk_suspects({"a": ok}, Bounds()) == []


def test_allreduce_and_free_port_parsed() -> None:
    assert parse_allreduce("busbw gloo 1250000000.0\n") == ("gloo", 1.25e9)
    assert parse_allreduce("fail RuntimeError: Connection reset\n") == \
        "RuntimeError: Connection reset"
    assert parse_allreduce("busbw tcp 5\nTraceback\nboom\n") == "boom"
    assert parse_allreduce("busbw gloo nan\n") == "busbw gloo nan"
    assert parse_allreduce("") == "rank 0 said nothing"
    assert parse_free_port("port 4242\n") == 4242
    assert parse_free_port("port 0\n") is None and parse_free_port("port 99999") is None
    e = dataclasses.replace(exam(full_mesh({})), ring=Ring("gloo", 1.2e9, 4))
    assert summary(e, []).startswith("4 hosts, 6 links in 3 rounds, all-reduce (gloo, 4 "
                                     "ranks) bus bandwidth 1.2 GB/s:")
    assert as_json(e, [])["allreduce"] == {"backend": "gloo", "ranks": 4,
                                           "busbw_bytes_per_s": 1.2e9, "error": None}


def test_a_figure_is_judged_against_its_usual_not_its_best_look() -> None:
    """A disk shared with other work measures far apart from one look to the next: one fast
    look makes no later one a regression; a fall below the usual does."""
    past = {"node5": [{"at": 1.0 + k, "figures": {"disk write": v}}
                      for k, v in enumerate([1.1e9, 2.1e8, 1.6e8, 2.3e8, 1.9e8])]}
    assert history.regressions(past, {"node5": {"disk write": 1.2e8}}, Bounds()) == []
    fell = history.regressions(past, {"node5": {"disk write": 2e7}}, Bounds())
    assert len(fell) == 1 and fell[0].startswith("node5's disk write: "), fell
