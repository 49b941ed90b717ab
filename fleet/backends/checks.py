"""What `fleet check` reports on either backend: one Check per host and thing, the checks of a
connection (login shell, rc files that print, SFTP), and the table they are printed as."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from fleet.transport import SSHTransport, Transport


class Status(Enum):
    PASS = "pass"
    WARN = "warn"  # it will run, but something is worth fixing
    FAIL = "fail"  # it will not run as it is


@dataclass(frozen=True)
class Check:
    host: str
    name: str
    status: Status
    detail: str
    fix: str = ""


RC_FIX = ("scp, rsync and sshd's external sftp-server (Debian's default) break on such output: "
          "print only in interactive shells (bash: `[[ $- == *i* ]] || return` at the top of "
          "~/.bashrc; zsh: move it from ~/.zshenv to ~/.zshrc; fish: `status is-interactive; or "
          "exit`; tcsh: `if ($?prompt) then ... endif`)")


def connection_checks(t: Transport) -> list[Check]:
    """How the node takes commands and files: login shell, rc files that print, SFTP."""
    name = t.host.name
    out = [Check(name, "ssh", Status.PASS, f"{t.host.transport} {t.host.address}"
                 + (f", login shell {t.shell}" if t.shell else ""))]
    noise = [line for line in t.noise.splitlines() if line.strip()]
    if noise:
        out.append(Check(name, "rc files", Status.WARN,
                         f"the login shell prints {len(noise)} line(s) for every command: "
                         f"{noise[0][:60]!r} (fleet ignores them)", RC_FIX))
    if isinstance(t, SSHTransport):
        if t.sftp_available():
            out.append(Check(name, "sftp", Status.PASS, "available"))
        elif t.sftp_garbled:
            out.append(Check(name, "sftp", Status.WARN, f"not usable ({t.sftp_problem}): fleet "
                             "sends files over the exec channel (verified, a little slower)",
                             RC_FIX))
        else:
            out.append(Check(name, "sftp", Status.WARN, f"not available ({t.sftp_problem}): "
                             "fleet sends files over the exec channel (verified, a little "
                             "slower)", "nothing to do; a `Subsystem sftp` line in sshd_config "
                             "makes large syncs faster"))
    return out


def table(checks: list[Check]) -> str:
    order = {n: i for i, n in enumerate(dict.fromkeys(c.host for c in checks))}
    rows = sorted(checks, key=lambda c: order[c.host])
    width = max((len(c.host) for c in rows), default=4)
    lines = [f"{'HOST':<{width}}  {'CHECK':<17} {'STATUS':<6} DETAIL"]
    for c in rows:
        lines.append(f"{c.host:<{width}}  {c.name:<17} {c.status.value.upper():<6} {c.detail}")
        if c.fix and c.status is not Status.PASS:
            lines.append(f"{'':<{width}}  {'':<17} {'':<6} fix: {c.fix}")
    return "\n".join(lines)
