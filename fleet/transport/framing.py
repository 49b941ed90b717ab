"""The banner-proof framing of a node's scripts, pure and I/O-free: the markers around what a
script prints, its Result, the verified write's script and answer, and the node's clock.

A node's login shell may be bash, zsh, dash, fish or tcsh, and its rc files may print banners.
So the login shell only ever sees one trivial command, `/bin/sh -s`, and the real script reaches
that POSIX shell on stdin, framed by markers that no banner can forge: what fleet parses is only
what the script printed between them. Every write is checked (size and SHA-256) before it
replaces the target, so a full disk is an error that says so instead of an empty script.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from fleet.errors import RemoteCommandError
from fleet.nodedata import number
from fleet.shell import quote
from fleet.sizes import short

# What the login shell runs: no quotes, no operators, the same in every shell.
BOOT = "/bin/sh -s"


@dataclass(frozen=True)
class Result:
    """A script's outcome on a node: only what the script itself printed, noise set apart."""

    command: str  # what it was for, as the user would name it
    code: int
    out: str
    err: str
    noise: str = ""  # what the login shell's rc files printed before the script ran

    @property
    def ok(self) -> bool:
        return self.code == 0

    def check(self, host: str) -> Result:
        """This result, or a RemoteCommandError naming the host, the command and its output."""
        if not self.ok:
            raise RemoteCommandError(host, self.command, self.code, self.err or self.out)
        return self


def frame(script: str, token: str, merge_stderr: bool = False) -> str:
    """The text fed to `/bin/sh -s`: markers on both streams around the script, which runs in a
    subshell (parsed whole before it starts) with stdin from /dev/null."""
    begin, end = f"FLEET-{token}-BEGIN", f"FLEET-{token}-END"
    merge = "exec 2>&1\n" if merge_stderr else ""
    return (f"printf '\\n%s\\n' {begin}; printf '\\n%s\\n' {begin} >&2\n"
            f"(\n{merge}{script}\n) </dev/null\n"
            "fleet_status=$?\n"
            f"printf '\\n%s\\n' {end}; printf '\\n%s\\n' {end} >&2\n"
            "exit $fleet_status\n")


def unframe(raw: str, token: str) -> tuple[str, str, bool]:
    """(what the script printed, what came before it, whether the script started at all)."""
    begin, end = f"\nFLEET-{token}-BEGIN\n", f"\nFLEET-{token}-END\n"
    at = raw.find(begin)
    if at < 0:
        return "", raw, False
    body = raw[at + len(begin):]
    stop = body.rfind(end)
    return (body[:stop] if stop >= 0 else body), raw[:at], True


def verify_script(tmp: str, target: str, data: bytes, mode: int, then: str = "") -> str:
    """Replaces target with tmp only if tmp holds exactly `data`, then runs `then` (its status
    is the script's); else says what arrived and how much room is left (see parse_verify)."""
    size, digest = len(data), hashlib.sha256(data).hexdigest()
    t, dest = quote(tmp), quote(target)
    return "\n".join([
        f"got=$(wc -c < {t} 2>/dev/null | tr -d ' ')",
        f"sum={digest}",
        f"command -v sha256sum >/dev/null 2>&1 && sum=$(sha256sum < {t} | cut -c1-64)",
        f'if [ "$got" = {size} ] && [ "$sum" = {digest} ]; then',
        f"  if chmod {mode:o} {t} && mv -f {t} {dest}; then",
        "    echo written",
        f"    {then or 'true'}",
        "    exit $?",
        "  fi",
        "fi",
        f"rm -f {t}",
        'echo "got=${got:-0}"',
        f'df -Pk "$(dirname {dest})" 2>/dev/null | tail -n 1 | sed "s/^/df=/"',
        "exit 1",
    ])


@dataclass(frozen=True)
class Written:
    ok: bool
    got: int = 0  # bytes that arrived, when not ok
    free_kib: int | None = None
    mount: str = ""


def parse_verify(out: str) -> Written:
    if "written" in out.split():
        return Written(True)
    got, free, mount = 0, None, ""
    for line in out.splitlines():
        if line.startswith("got=") and (n := number(line[4:])) is not None:
            got = n
        elif line.startswith("df="):
            fields = line[3:].split()
            if len(fields) >= 6 and (kib := number(fields[3])) is not None:
                free, mount = kib, fields[5]
    return Written(False, got, free, mount)


def write_problem(host: str, target: str, size: int, w: Written, cause: str = "") -> str:
    """The message for a write that did not arrive whole, with the likely cause and the fix."""
    msg = f"cannot write {target} on {host}: {short(w.got)} of {short(size)} arrived"
    if w.free_kib is not None and w.free_kib * 1024 < max(size, 1 << 20):
        return (f"{msg}; the disk or your quota is full ({short(w.free_kib * 1024)} free on "
                f"{w.mount}). "
                "Free space there, or set `workdir` for this host to a larger disk")
    return msg + (f" ({cause})" if cause else "") + \
        "; check the permissions of the directory and that its filesystem is writable"


def clock_offset(node_time: str, sent: float, received: float) -> float:
    """The node's clock minus this machine's, from the node's time stamp taken between `sent`
    and `received`. The stamp is the script's last act, after the login shell's rc files (which
    may take seconds): it is compared with `received`, off by the way back alone, not with the
    midpoint of a round trip that rc files may have made lopsided."""
    try:
        return float(node_time) - received if sent <= received else 0.0
    except ValueError:
        return 0.0
