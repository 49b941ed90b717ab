"""Each fact fleet reads from a node is a script plus a pure parser: the parsers against captured
output (noisy rc files included), and the framing through every real login shell."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fleet.backends.hosts import node as remote
from fleet.backends.hosts.ports import parse_listener
from fleet.backends.hosts.prepare import version_problems
from fleet.config.inventory import Host
from fleet.config.job import Launcher
from fleet.facts import run_state
from fleet.facts.probe import (
    Facts,
    PythonState,
    net_for,
    parse_probe,
    python_problem,
    storage_groups,
)
from fleet.run.record import Wrapper, note_wrapper, parse_wrapper, wrapper
from fleet.states import NodeStatus
from fleet.transport.framing import (
    BOOT,
    Written,
    frame,
    parse_verify,
    unframe,
    verify_script,
    write_problem,
)
from fleet.transport.lines import Lines
from fleet.transport.sync import parse_manifest

BANNER = "Welcome to the lab cluster; module load cuda/12\n"
TOKEN = "0123456789abcdef"


# ---- framing --------------------------------------------------------------------------------
def test_unframe_drops_what_rc_files_printed() -> None:
    raw = (BANNER + f"\nFLEET-{TOKEN}-BEGIN\n" + "pid=12\ncode=\n" +
           f"\nFLEET-{TOKEN}-END\n" + "bye from .logout\n")
    out, noise, started = unframe(raw, TOKEN)
    assert (out, noise, started) == ("pid=12\ncode=\n", BANNER, True)


def test_unframe_keeps_output_without_a_final_newline_exactly() -> None:
    out, _, _ = unframe(f"\nFLEET-{TOKEN}-BEGIN\n/root\nFLEET-{TOKEN}-END\n", TOKEN)
    assert out == "/root"


def test_noise_without_a_final_newline_keeps_the_output() -> None:
    """`printf 'Loading modules...'` in an rc file: the marker still starts a line of its own."""
    raw = f"Loading modules...\nFLEET-{TOKEN}-BEGIN\nx=1\n\nFLEET-{TOKEN}-END\n"
    assert unframe(raw, TOKEN)[:2] == ("x=1\n", "Loading modules...")
    got: list[str] = []
    lines = Lines(TOKEN, got.extend)
    lines.feed(raw.encode())
    lines.close()
    assert got == ["x=1"]


def test_unframe_of_a_script_that_never_started() -> None:
    out, noise, started = unframe("fish: Unknown command: /bin/sh\n", TOKEN)
    assert (out, started) == ("", False) and "Unknown command" in noise


def test_a_banner_cannot_forge_the_marker() -> None:
    raw = "\nFLEET-aaaa-BEGIN\nfake\n" + f"\nFLEET-{TOKEN}-BEGIN\nreal\n\nFLEET-{TOKEN}-END\n"
    assert unframe(raw, TOKEN)[0] == "real\n"


def test_streamed_lines_after_the_marker_only_blank_lines_kept() -> None:
    got: list[str] = []
    lines = Lines(TOKEN, got.extend)
    stream = (BANNER + f"FLEET-{TOKEN}-BEGIN\n" + "[default0]:a\n\n\nb\n" +
              f"\nFLEET-{TOKEN}-END\n" + "trailing noise\n").encode()
    for i in range(0, len(stream), 7):  # chunks that cut lines and markers anywhere
        lines.feed(stream[i:i + 7])
    lines.close()
    assert got == ["[default0]:a", "", "", "b"]


SHELLS = {
    "bash": (".bashrc", "echo '{o}'; echo '{e}' >&2\n"),
    "zsh": (".zshenv", "echo '{o}'; echo '{e}' >&2\n"),
    "dash": (".profile", "echo '{o}'\n"),  # read by login shells only: sshd's are not
    "fish": (".config/fish/config.fish", "echo '{o}'; echo '{e}' >&2\n"),
    "tcsh": (".tcshrc", "echo '{o}'; echo '{e}' > /dev/stderr\n"),
}
SCRIPT = r"""
printf 'home=%s\n' "$HOME"
x='it'"'"'s $(not run) `nor` this! \\ %s'
printf '%s\n' "$x"
for i in 1 2; do echo "n=$i"; done
echo to-stderr >&2
exit 3
"""


@pytest.mark.parametrize("shell", sorted(SHELLS))
def test_framed_script_through_a_real_login_shell(shell: str, tmp_path: Path) -> None:
    """What sshd does: `<login shell> -c '/bin/sh -s'`, the script on stdin, rc files that
    print on both streams. The script's own output comes back exact, the banner set apart."""
    path = shutil.which(shell)
    if path is None:
        pytest.skip(f"{shell} not installed (.ci/setup installs it)")
    rc, text = SHELLS[shell]
    (tmp_path / rc).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rc).write_text(text.format(o="Welcome to the lab", e="quota: 81% used"))
    # SSH_CLIENT set, as sshd sets it: Debian's bash then reads ~/.bashrc for `bash -c`.
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "SSH_CLIENT": "10.0.0.1 5000 22"}
    p = subprocess.run([path, "-c", BOOT], input=frame(SCRIPT, TOKEN), capture_output=True,
                       text=True, timeout=30, env=env)
    out, noise, started = unframe(p.stdout, TOKEN)
    err, enoise, _ = unframe(p.stderr, TOKEN)
    assert started, p.stdout + p.stderr
    assert p.returncode == 3
    assert out == (f"home={tmp_path}\nit's $(not run) `nor` this! \\\\ %s\nn=1\nn=2\n")
    assert err == "to-stderr\n"
    if shell != "dash":
        assert "Welcome to the lab" in noise and "quota" in enoise


# ---- probe ----------------------------------------------------------------------------------
def probe_output(**py: object) -> str:
    base: dict[str, object] = {"python": "3.11.7", "torch": "2.14.1", "has_torch": True,
                               "addrs": [["lo", "127.0.0.1"], ["docker0", "172.17.0.1"],
                                         ["eth0", "10.1.0.12"], ["lo", "::1"],
                                         ["eth0", "fe80::1%eth0"], ["eth0", "fd00::12"]]}
    base.update(py)
    return ("hostname=node2\nssh=10.1.0.1 52000 10.1.0.12 22\n"
            f"py={json.dumps(base)}\nstorage=5e1f00aa\n")


def test_parse_probe() -> None:
    f = parse_probe(probe_output(route_src="10.1.0.12"))
    assert (f.hostname, f.server_ip, f.python, f.python_version, f.torch_version, f.storage) \
        == ("node2", "10.1.0.12", PythonState.OK, "3.11.7", "2.14.1", "5e1f00aa")
    assert ("eth0", "fe80::1") in f.addrs and ("eth0", "fd00::12") in f.addrs
    assert f.route_src == "10.1.0.12"


def test_parse_probe_deep_takes_what_check_needs_as_types() -> None:
    check = {"torch": "2.14.1+cu130", "cuda": "13.0", "nccl": "", "gpus": 2,
             "torchvision": "0.29.1", "driver": "580.1", "gpu_processes": ["4242, python, 9 MiB"],
             "hostname_resolves": ["127.0.1.1"], "reverse_dns_s": 0.25,
             "disk_free": 5 << 30, "disk_path": "/root/fleet"}
    h = parse_probe(probe_output(check=check)).health
    assert h is not None
    assert (h.torch, h.cuda, h.gpus, h.driver, h.resolves, h.reverse_dns_s, h.disk_free) == \
        ("2.14.1+cu130", "13.0", 2, "580.1", ("127.0.1.1",), 0.25, 5 << 30)
    assert h.gpu_processes == ("4242, python, 9 MiB",) and h.torch_error == ""
    # What a node says is data: wrong types give nothing, not an exception.
    odd = parse_probe(probe_output(check={"gpus": "²", "disk_free": -1, "reverse_dns_s": "x",
                                          "hostname_resolves": "a", "torch_error": "E: x"}))
    assert odd.health is not None
    assert (odd.health.gpus, odd.health.disk_free, odd.health.reverse_dns_s,
            odd.health.resolves, odd.health.torch_error) == (0, 0, 0.0, (), "E: x")
    assert parse_probe(probe_output()).health is None
    assert parse_probe(probe_output(check=[1])).health is None
    assert parse_probe("hostname=n\npy=[1, 2]\n").python is PythonState.MISSING


def test_parse_probe_python_missing_or_without_torch() -> None:
    missing = parse_probe("hostname=n\nssh=\nsh: 1: /opt/py: not found\n"
                          "storage=\n")
    assert missing.python is PythonState.MISSING and "not found" in missing.detail
    assert parse_probe(probe_output(has_torch=False)).python is PythonState.NO_TORCH


HOST = Host(name="node2", address="10.1.0.12")


def test_an_accelerate_job_needs_accelerate_on_every_node() -> None:
    without, with_it = parse_probe(probe_output()), parse_probe(probe_output(accelerate="1.15.0"))
    assert with_it.accelerate_version == "1.15.0" and without.accelerate_version == ""
    assert python_problem(HOST, without) is None
    assert "has no accelerate" in (python_problem(HOST, without, Launcher.ACCELERATE) or "")
    assert python_problem(HOST, with_it, Launcher.ACCELERATE) is None


def test_route_through_the_interface_holding_the_source_address() -> None:
    f = parse_probe(probe_output(route_src="10.1.0.12"))
    net = net_for(HOST, f, "10.1.0.11")
    assert (net.interface, net.address) == ("eth0", "10.1.0.12")


def test_route_ipv6_and_the_master_itself() -> None:
    f = parse_probe(probe_output(route_src="fd00::12"))
    net = net_for(HOST, f, "fd00::11")
    assert (net.interface, net.address) == ("eth0", "fd00::12")
    master = net_for(HOST, f, "fd00::12")
    assert master.interface == "eth0" and "holds the master address" in master.reason


def test_pinned_interface_takes_a_global_address_of_the_masters_family() -> None:
    f = parse_probe(probe_output())
    pinned = Host(name="node2", address="x", interface="eth0")
    assert net_for(pinned, f, "fd00::11").address == "fd00::12"
    assert net_for(pinned, f, "10.1.0.11").address == "10.1.0.12"


def test_no_route_names_the_reason() -> None:
    f = parse_probe(probe_output(route_error="[Errno 101] Network is unreachable"))
    with pytest.raises(RuntimeError, match="Network is unreachable"):
        net_for(HOST, f, "10.9.9.9")


def test_storage_groups_keep_inventory_order_and_unknowns_apart() -> None:
    facts = {n: Facts(n, None, (), PythonState.OK, storage=s) for n, s in
             (("a", "x"), ("b", "y"), ("c", "x"), ("d", ""), ("e", ""))}
    assert storage_groups(facts) == [["a", "c"], ["b"], ["d"], ["e"]]


def test_version_problems_name_the_node_and_both_versions() -> None:
    facts = {"n1": Facts("n1", None, (), PythonState.OK, "3.11.7", "2.14.1"),
             "n2": Facts("n2", None, (), PythonState.OK, "3.11.9", "2.14.1"),
             "n3": Facts("n3", None, (), PythonState.OK, "3.12.1", "2.13.0")}
    problems = version_problems(facts, "n1")
    assert list(problems) == ["n3"]
    assert "python 3.12 here, 3.11 on n1" in problems["n3"]
    assert "torch 2.13.0 here, 2.14.1 on n1" in problems["n3"]


# ---- run state, held runs, stop, start ------------------------------------------------------
def test_parse_state() -> None:
    running = run_state.parse_state("pid=41\ncode=\nstarted=1700000000\nended=\nlast=1700000050\n"
                                 "now=1700000070\nalive\n")
    assert (running.status, running.pid, running.elapsed) == (NodeStatus.RUNNING, 41, 70)
    failed = run_state.parse_state("pid=41\ncode=1\nstarted=1700000000\nended=1700000060\n"
                                "last=1700000060\nnow=1700000900\n")
    assert (failed.status, failed.code, failed.elapsed) == (NodeStatus.FAILED, 1, 60)
    stopped = run_state.parse_state("pid=41\ncode=143\nstarted=1\nended=2\nnow=9\n"
                                 "stop|fleet stop\nstop|key=k1\n", "k1")
    assert (stopped.status, stopped.stopped_by) == (NodeStatus.STOPPED, "fleet stop")
    assert run_state.parse_state("missing\n").status is NodeStatus.MISSING
    assert run_state.parse_state("pid=\ncode=\nstarted=\nended=\nnow=5\n").status is \
        NodeStatus.STARTING


@pytest.mark.parametrize("said", ["0", "1", "junk"])
def test_an_exit_code_means_nothing_while_the_wrapper_lives(said: str) -> None:
    """run.sh writes exit_code as it ends: one there while it lives is the job's own. Running,
    no code, no end to keep (a `status` during the run must not record an outcome)."""
    st = run_state.parse_state(f"pid=41\ncode={said}\nstarted=100\nended=110\nnow=150\n"
                               "alive\n")
    assert (st.status, st.code, st.bad, st.elapsed, st.done) == (NodeStatus.RUNNING, None, "",
                                                                  50, False)


@pytest.mark.parametrize("said", ["256", "-1", "99999", "0x0", "1e0", "0 1", "²"])
def test_an_exit_code_is_a_small_whole_number(said: str) -> None:
    """What run.sh writes is `$?`, 0-255; anything else in the file is no exit code (the job
    can write it too): failed, saying what it held, never taken as a code."""
    st = run_state.parse_state(f"pid=41\ncode={said}\nstarted=1\nended=2\nnow=9\n")
    assert (st.status, st.code) == (NodeStatus.FAILED, None)
    assert "no exit code" in st.bad and st.outcome("n1", 0).describe().startswith("failed: its")
    assert run_state.exit_code("255") == 255 and run_state.exit_code("0") == 0


def test_a_node_killed_outright_stops_counting_time() -> None:
    """No exit code, wrapper gone: it ran until its last sign of life, not until now (and the
    control machine's clock plays no part)."""
    killed = run_state.parse_state("pid=41\ncode=\nstarted=100\nended=\nlast=130\nnow=999\n")
    assert (killed.status, killed.elapsed) == (NodeStatus.FAILED, 30)
    stopped = run_state.parse_state("pid=41\ncode=\nstarted=100\nended=\nlast=130\nnow=999\n"
                                 "stop|fail-fast: node2 failed\nstop|key=k1\n", "k1")
    assert (stopped.status, stopped.stopped_by) == (NodeStatus.STOPPED, "fail-fast: node2 failed")


def test_parse_held_counts_only_runs_of_this_machine() -> None:
    out = ("me=node1 6f1c-boot\n"
           "run=r1/node1 yes node1 6f1c-boot\n"
           "run=r1/node2 yes node2 6f1c-boot\n"  # same boot (one kernel), other host: not ours
           "run=r2/node1 no node1 6f1c-boot\n"
           "run=r3/node1 yes\n")  # no machine file yet (just started): ours
    assert run_state.parse_held(out) == ["r1/node1", "r3/node1"]


def test_parse_stop_and_start() -> None:
    assert remote.parse_stop("left=\n") == []
    assert remote.parse_stop("left=12 13\n") == [12, 13]
    assert remote.parse_stop("sh: stop.sh: No such file\n") is None
    assert remote.parse_start("4242 396188\n") == (4242, Wrapper(4242, 396188))
    # A node whose /proc could not be read says the pid alone: no wrapper is recorded then.
    assert remote.parse_start("4242 \n") == (4242, None)
    assert remote.parse_start("") == (None, None)
    assert remote.parse_start("motd\n4242 12 13\n") == (None, None)
    assert remote.parse_start("4242 1e9\n") == (4242, None)


def test_parse_wrapper(tmp_path: Path) -> None:
    assert parse_wrapper("4242 396188\n") == Wrapper(4242, 396188)
    assert wrapper(tmp_path, "node1") is None
    note_wrapper(tmp_path, "node1", Wrapper(4242, 396188))
    assert wrapper(tmp_path, "node1") == Wrapper(4242, 396188)
    for bad in ("", "4242", "4242 -1", "4242 1 2", "x 1", "4242 " + "9" * 21):
        assert parse_wrapper(bad) is None, bad


def test_stop_says_whether_it_found_anything() -> None:
    """stop.sh's `found=`: no only where it says so (a stop.sh of an older run does not)."""
    assert remote.parse_found("found=yes\nleft=\n") is True
    assert remote.parse_found("found=no\nleft=\n") is False
    assert remote.parse_found("left=\n") is True


# ---- writes ---------------------------------------------------------------------------------
def test_parse_verify_of_a_full_disk() -> None:
    out = "got=0\ndf=tmpfs 64 64 0 100% /root/tiny\n"
    w = parse_verify(out)
    assert w == Written(False, 0, 0, "/root/tiny")
    msg = write_problem("node2", "/root/tiny/runs/x/run.sh", 900, w)
    assert "node2" in msg and "/root/tiny/runs/x/run.sh" in msg and "0 bytes of 900 bytes" in msg
    assert "disk or your quota is full (0 bytes free on /root/tiny)" in msg
    w = parse_verify("got=2048\ndf=tmpfs 64 64 3 100% /root/tiny\n")
    msg = write_problem("node2", "/root/tiny/big", 3 << 20, w)
    assert "2 KiB of 3 MiB arrived" in msg and "(3 KiB free on /root/tiny)" in msg, msg
    assert parse_verify("written\n").ok


def test_verify_script_replaces_only_a_whole_file(tmp_path: Path) -> None:
    target, tmp = tmp_path / "run.sh", tmp_path / "run.sh.fleet-1"
    tmp.write_bytes(b"echo hi\n")
    short = subprocess.run(["sh", "-c", verify_script(str(tmp), str(target), b"echo hi!\n",
                                                      0o700)],
                           capture_output=True, text=True, timeout=30)
    assert short.returncode == 1 and not target.exists() and not tmp.exists()
    assert parse_verify(short.stdout).got == 8
    tmp.write_bytes(b"echo hi\n")
    ok = subprocess.run(["sh", "-c", verify_script(str(tmp), str(target), b"echo hi\n", 0o700)],
                        capture_output=True, text=True, timeout=30)
    assert parse_verify(ok.stdout).ok and target.read_bytes() == b"echo hi\n"
    assert target.stat().st_mode & 0o777 == 0o700


def test_parse_listener() -> None:
    assert parse_listener("listening 29500 812\n") == (True, "29500", "812")
    assert parse_listener("busy [Errno 98] Address already in use\n") == \
        (False, "[Errno 98] Address already in use", "")


def test_parse_manifest() -> None:
    out = ("train.py\t812\t1700000000.1234567890\nsub/dir/a b.txt\t0\t1700000001.5\n"
           "whole.txt\t3\t1700000002\nbad line\nbad time\t1\t17e8\nminus\t1\t-5.0\n")
    assert parse_manifest(out) == {"train.py": (812, 1700000000_123456789),
                                   "sub/dir/a b.txt": (0, 1700000001_500000000),
                                   "whole.txt": (3, 1700000002_000000000)}


def test_an_edit_within_the_second_of_the_last_sync_is_a_change() -> None:
    from fleet.transport.sync import changed
    synced = {"v.py": (16, 1700000000_100000000)}
    assert changed({"v.py": (16, 1700000000_900000000)}, synced) == ["v.py"]
    assert changed({"v.py": (16, 1700000000_100000000)}, synced) == []
    # a node whose filesystem keeps whole seconds: compared to the second
    assert changed({"v.py": (16, 1700000000_900000000)}, {"v.py": (16, 1700000000_000000000)}) \
        == []
    assert changed({"v.py": (16, 1700000001_000000000)}, {"v.py": (16, 1700000000_000000000)}) \
        == ["v.py"]


def test_a_pid_counts_only_on_the_machine_that_recorded_it() -> None:
    """After a reboot (another boot id) the recorded pid may be anyone's: not alive."""
    base = "pid=41\ncode=\nstarted=100\nended=\nlast=130\nnow=999\nalive\nme=node2 boot-B\n"
    assert run_state.parse_state(base + "machine=node2 boot-B\n").status is NodeStatus.RUNNING
    rebooted = run_state.parse_state(base + "machine=node2 boot-A\n")
    assert (rebooted.status, rebooted.elapsed) == (NodeStatus.FAILED, 30)


# ---- one listing and one bundle per node ------------------------------------------------------
def test_listing_of_several_directories_in_one_round_trip(tmp_path: Path) -> None:
    from fleet.transport.sync import listing_script, parse_listing
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.py").write_text("x")
    out = subprocess.run(["sh", "-c", listing_script(
        [str(tmp_path / "a"), str(tmp_path / "b")], private=(str(tmp_path / "run"),),
        make=(str(tmp_path / "c"),))], capture_output=True, text=True, check=True).stdout
    a, b = parse_listing(out, 2)
    assert list(a) == ["x.py"] and a["x.py"][0] == 1
    assert b == {}  # created, empty
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "c").is_dir()


def test_bundle_unpacks_code_and_run_files_with_modes_and_mtimes(tmp_path: Path) -> None:
    """What changed and the run's own files in one tar: each lands at its path under the
    bundle's root, with its mode; synced files keep their mtime, so the next listing finds
    them unchanged."""
    from fleet.transport.sync import (
        Entry,
        bundle,
        bundle_root,
        changed,
        code_entries,
        listing_script,
        local_manifest,
        parse_listing,
    )
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print('hi')\n")
    (src / "pkg" / "run").write_text("#!/bin/sh\n")
    (src / "pkg" / "run").chmod(0o755)
    os.utime(src / "train.py", (1_700_000_000, 1_700_000_000))
    node = tmp_path / "node"
    code, run = f"{node}/code/job", f"{node}/runs/r1/n1"
    local = local_manifest(src, ())
    entries = code_entries(src, code, changed(local, {}))
    entries += [Entry(f"{run}/env.sh", 0o600, data=b"export A=1\n"),
                Entry(f"{run}/site/sitecustomize.py", 0o644, data=b"")]
    root = bundle_root(entries)
    assert root == str(node)
    node.mkdir()  # the listing made it
    tar = tmp_path / "b.tar.gz"
    tar.write_bytes(bundle(entries, root)[0])
    subprocess.run(["tar", "-xzpf", str(tar), "--no-same-owner", "-C", root], check=True)
    assert Path(code, "train.py").read_text() == "print('hi')\n"
    assert Path(code, "pkg", "run").stat().st_mode & 0o777 == 0o755
    assert Path(run, "env.sh").stat().st_mode & 0o777 == 0o600
    assert Path(run, "site", "sitecustomize.py").exists()
    out = subprocess.run(["sh", "-c", listing_script([code])], capture_output=True, text=True,
                         check=True).stdout
    assert changed(local, parse_listing(out, 1)[0]) == []
    # to the nanosecond (the pax header): an edit within the second is seen next time
    assert Path(code, "pkg", "run").stat().st_mtime_ns == (src / "pkg" / "run").stat().st_mtime_ns


def test_probe_learns_home_shell_and_clock_where_a_hello_would(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection skips its hello: the probe, run for real by sh, says the home, the login
    shell and the clock, and expands a leading ~ in the workdir and python itself (a hostile
    directory name arrives literally)."""
    import sys
    import time

    from fleet.facts.probe import probe
    from fleet.transport.local import LocalTransport

    home = tmp_path / "home $(touch pwned) 'q'"
    (home / "venv" / "bin").mkdir(parents=True)
    py = home / "venv" / "bin" / "python"
    py.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    py.chmod(0o755)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SHELL", "/usr/bin/fish")
    host = Host("n1", "localhost", transport="local", python="~/venv/bin/python",
                workdir="~/fleet work")
    t = LocalTransport(host)
    t.connect(hello=False)
    assert t.home == ""
    f = probe(t, None, create=True)
    assert (t.home, t.shell, f.home, f.shell) == (str(home), "/usr/bin/fish", str(home),
                                                  "/usr/bin/fish")
    assert f.python is PythonState.OK and f.python_version == sys.version.split()[0]
    assert len(f.storage) == 16 and (home / "fleet work" / ".fleet-storage").is_file()
    assert abs(t.clock_offset) < 5 and abs(float(f.node_time) - time.time()) < 60
    assert t.path("~/fleet work") == f"{home}/fleet work"
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_parse_probe_home_shell_and_clock() -> None:
    f = parse_probe("home=/home/a b\nshell=/bin/tcsh\n" + probe_output() + "now=1700000000.5\n")
    assert (f.home, f.shell, f.node_time) == ("/home/a b", "/bin/tcsh", "1700000000.5")


def test_a_stop_that_found_the_part_ended_already_is_no_stop() -> None:
    """stop.sh found nothing of a part that had started and records no end (the node rebooted):
    it ended by itself, killed outright, not by fleet's stop; one that never started was."""
    base = "pid=41\ncode=\nstarted=100\nended=\nlast=130\nnow=999\n" \
           "stop|fleet up, once n2 answered again\nstop|key=k1\n"
    assert run_state.parse_state(base, "k1").status is NodeStatus.STOPPED
    gone = run_state.parse_state(base + "stop|found=none\n", "k1")
    assert (gone.status, gone.stopped_by) == (NodeStatus.FAILED, "")
    never = run_state.parse_state(base.replace("pid=41", "pid=") + "stop|found=none\n", "k1")
    assert never.status is NodeStatus.STOPPED
