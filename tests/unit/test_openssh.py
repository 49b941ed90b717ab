"""The bulk stream through OpenSSH's `ssh`: the command line built (trust exactly as fleet's),
when fleet's own connection carries the stream instead, and a real transfer through the pipe
(a local shell standing in for `ssh`), falling back when the binary does not start."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleet.config.inventory import Host
from fleet.console import Console
from fleet.transport import openssh
from fleet.transport.local import LocalTransport
from fleet.transport.sync import scan
from fleet.transport.transfer import push, receiver
from fleet.transport.transfer.plan import BUNDLE_MAX

EP = openssh.Endpoint("10.0.0.7", 2222, "ml", ("/keys/id_ed25519",),
                      ("/home/ml/.ssh/known_hosts", "/lab/known_hosts"), 7.5)


def opts(args: list[str]) -> dict[str, str]:
    return dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "-o")


def test_the_command_line_keeps_fleets_trust_and_login() -> None:
    args = openssh.argv("/usr/bin/ssh", EP, "/bin/sh -s")
    o = opts(args)
    assert args[:3] == ["/usr/bin/ssh", "-F", "/dev/null"]  # no user config can loosen it
    assert o["StrictHostKeyChecking"] == "yes" and o["BatchMode"] == "yes"
    assert o["UserKnownHostsFile"] == "/home/ml/.ssh/known_hosts /lab/known_hosts"
    assert o["GlobalKnownHostsFile"] == "/dev/null" and o["UpdateHostKeys"] == "no"
    assert o["CheckHostIP"] == "no"  # an old ssh would write the address into known_hosts
    assert o["ProxyCommand"] == "none" and o["ProxyJump"] == "none"
    assert o["ControlPath"] == "none" and o["ConnectTimeout"] == "8"
    assert o["Ciphers"].startswith("aes128-gcm@openssh.com,")
    assert args[args.index("-i") + 1] == "/keys/id_ed25519"
    assert args[-7:] == ["-p", "2222", "-l", "ml", "--", "10.0.0.7", "/bin/sh -s"]
    # one of each: ssh takes the first it reads
    assert [a for a in args if a.startswith("StrictHostKeyChecking")] == \
        ["StrictHostKeyChecking=yes"]


def conn(**kw: object) -> SimpleNamespace:
    base: dict[str, object] = {"host": "10.0.0.7", "port": 22, "user": "ml", "gateway": None,
                               "connect_kwargs": {"key_filename": ["/keys/id"]},
                               "ssh_config": {}}
    return SimpleNamespace(**{**base, **kw})


HOST = Host("n1", "10.0.0.7", user="ml", identity="/keys/id", known_hosts="/lab/kh")


@pytest.mark.parametrize(("host", "c", "ssh", "why"), [
    (HOST, conn(), None, "no `ssh` installed"),
    (Host("n1", "10.0.0.7", host_key="ssh-ed25519 AAAA"), conn(), "/usr/bin/ssh", "pinned"),
    (HOST, conn(gateway="bastion"), "/usr/bin/ssh", "jump host"),
    (Host("n1", "h", transport="local"), conn(), "/usr/bin/ssh", "not an SSH host"),
    (HOST, conn(connect_kwargs={"key_filename": ["/my keys/id"]}), "/usr/bin/ssh", "blanks"),
    (Host("n1", "h", known_hosts="/kh/%h"), conn(), "/usr/bin/ssh", "blanks, %"),
    (Host("n1", "h", known_hosts="/lab/${USER}/kh"), conn(), "/usr/bin/ssh", "blanks, %"),
])
def test_fleets_own_connection_carries_what_the_binary_cannot(
        host: Host, c: SimpleNamespace, ssh: str | None, why: str) -> None:
    assert why in (openssh.why_not(host, c, ssh) or "")


def test_a_plain_host_goes_through_the_binary_unless_turned_off(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert openssh.why_not(HOST, conn(), "/usr/bin/ssh") is None
    ep = openssh.endpoint(HOST, conn(connect_kwargs={"key_filename": ["/keys/id", "/keys/id"]}))
    assert ep.identities == ("/keys/id",)
    assert ep.known_hosts == (f"{tmp_path}/.ssh/known_hosts", "/lab/kh")
    monkeypatch.setenv(openssh.OFF, "0")
    assert openssh.why_not(HOST, conn(), "/usr/bin/ssh") == f"{openssh.OFF}=0"


def test_ssh_config_and_the_inventory_resolve_as_fleets_connection_does(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(
        "Host gpu1\n  HostName 10.1.2.3\n  Port 2200\n  User lab\n"
        f"  UserKnownHostsFile {tmp_path}/kh\n")
    args = openssh.command(Host("n1", "gpu1", identity="~/id", known_hosts="~/inv_kh"))
    assert isinstance(args, list)
    assert args[-7:-1] == ["-p", "2200", "-l", "lab", "--", "10.1.2.3"]
    assert opts(args)["UserKnownHostsFile"] == f"{tmp_path}/kh {tmp_path}/inv_kh"
    assert args[args.index("-i") + 1] == f"{tmp_path}/id"


def data(tmp_path: Path) -> tuple[Path, bytes]:
    src = tmp_path / "src"
    src.mkdir()
    big = os.urandom(BUNDLE_MAX + 12345)  # streamed, not bundled
    (src / "big.bin").write_bytes(big)
    return src, big


def test_a_transfer_streams_through_the_pipe_and_is_verified(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A local shell in the binary's place (`/bin/sh -s`, what ssh runs on the node)."""
    vias: list[str] = []
    made = receiver.Receiver.__init__

    def spy(self: receiver.Receiver, *a: object, **kw: object) -> None:
        made(self, *a, **kw)  # type: ignore[arg-type]
        vias.append(self.via)
    monkeypatch.setattr(receiver.Receiver, "__init__", spy)
    monkeypatch.setattr(openssh, "command", lambda host: ["/bin/sh", "-s"])
    monkeypatch.setattr(openssh, "BULK_MIN", BUNDLE_MAX)
    src, big = data(tmp_path)
    t = LocalTransport(Host("here", "localhost", transport="local"))
    st = push.sync_dir(t, sys.executable, scan(src, ()), str(tmp_path / "dst"), "data",
                       Console(live=False))
    assert st.files == 1 and vias == ["ssh"]
    assert hashlib.sha256((tmp_path / "dst" / "big.bin").read_bytes()).digest() == \
        hashlib.sha256(big).digest()


def test_a_binary_that_does_not_start_falls_back_to_fleets_connection(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    vias: list[receiver.Receiver] = []
    made = receiver.Receiver.__init__

    def spy(self: receiver.Receiver, *a: object, **kw: object) -> None:
        made(self, *a, **kw)  # type: ignore[arg-type]
        vias.append(self)
    monkeypatch.setattr(receiver.Receiver, "__init__", spy)
    monkeypatch.setattr(openssh, "command", lambda host: [
        "/bin/sh", "-c", "echo 'Host key verification failed.' >&2; exit 255"])
    monkeypatch.setattr(openssh, "BULK_MIN", BUNDLE_MAX)
    src, big = data(tmp_path)
    t = LocalTransport(Host("here", "localhost", transport="local"))
    push.sync_dir(t, sys.executable, scan(src, ()), str(tmp_path / "dst"), "data",
                  Console(live=False))
    assert (tmp_path / "dst" / "big.bin").read_bytes() == big
    assert vias[0].via == "ssh did not start (Host key verification failed.)"


def test_a_stream_under_bulk_min_stays_on_fleets_connection(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """ssh's own handshake costs more than it saves on a short stream."""
    made = receiver.Receiver.__init__
    vias: list[str] = []

    def spy(self: receiver.Receiver, *a: object, **kw: object) -> None:
        made(self, *a, **kw)  # type: ignore[arg-type]
        vias.append(self.via)
    monkeypatch.setattr(receiver.Receiver, "__init__", spy)
    monkeypatch.setattr(openssh, "command", lambda host: ["/bin/sh", "-s"])
    src, big = data(tmp_path)
    assert len(big) < openssh.BULK_MIN
    push.sync_dir(LocalTransport(Host("here", "localhost", transport="local")), sys.executable,
                  scan(src, ()), str(tmp_path / "dst"), "data", Console(live=False))
    assert vias == ["not the bulk of a stream"]
    assert (tmp_path / "dst" / "big.bin").read_bytes() == big
