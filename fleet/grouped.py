"""`fleet exec`'s answers as a person reads them, the way `clush -b` / `dshbak -c` show them: the
hosts that gave the same output and exit status under one header, the odd ones apart, then a
line for each host that failed, had no directory for the job, or gave no answer; and the exit
code that sums them up. Pure: text and meanings, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from fleet.console import Meaning
from fleet.errors import CommandTimedOut, ExitCode, TransportError, said_once
from fleet.facts.command import CAP, Absent, Answer, Outcome
from fleet.sizes import short
from fleet.transport.group import reason


@dataclass(frozen=True)
class Group:
    """Hosts (in the inventory's order) that gave one answer."""

    hosts: tuple[str, ...]
    answer: Answer

    @property
    def header(self) -> str:
        status = f": exit status {self.answer.code}" if self.answer.code else ""
        return f"---- {','.join(self.hosts)} ({len(self.hosts)}){status} ----"


def groups(outcomes: dict[str, Outcome]) -> list[Group]:
    """The answers grouped by output and exit status, in the order of each group's first host."""
    by: dict[Answer, list[str]] = {}
    for name, o in outcomes.items():
        if isinstance(o, Answer):
            by.setdefault(o, []).append(name)
    return [Group(tuple(hosts), answer) for answer, hosts in by.items()]


def block(g: Group) -> list[tuple[str, Meaning]]:
    """A group as lines for stdout: its header, the output as it came (its last newline is the
    line's own), and what was cut."""
    lines = [(g.header, Meaning.FAIL if g.answer.code else Meaning.NAME)]
    if g.answer.output:
        lines.append((g.answer.output.removesuffix("\n"), Meaning.PLAIN))
    if g.answer.cut:
        lines.append((f"[output cut after {short(CAP)}: {short(g.answer.cut)} more not shown]",
                      Meaning.WARN))
    return lines


def summary(outcomes: dict[str, Outcome]) -> list[tuple[str, Meaning]]:
    """Lines for stderr: each host that did not exit 0, and why (hosts with the same words
    said once, named together), then how many did."""
    said: dict[str, str] = {}
    for name, o in outcomes.items():
        if isinstance(o, Answer) and o.code:
            said[name] = f"exit status {o.code}"
        elif isinstance(o, Absent):
            hint = f" ({o.hint})" if o.hint else ""
            said[name] = f"not run: {o.directory} is not there{hint}"
        elif isinstance(o, CommandTimedOut):  # its words name the host and say "no answer"
            said[name] = f"{reason(o)} (it may still run there)"
        elif isinstance(o, TransportError):
            said[name] = f"unreachable: {reason(o)}"
        elif isinstance(o, Exception):
            said[name] = f"no answer: {reason(o)}"
    lines = [(f"{', '.join(hosts)}: {words}", Meaning.FAIL) for hosts, words in said_once(said)]
    ok = sum(1 for o in outcomes.values() if isinstance(o, Answer) and not o.code)
    lines.append((f"{ok} of {len(outcomes)} host(s) exited 0",
                  Meaning.OK if ok == len(outcomes) else Meaning.WARN))
    return lines


def exit_code(outcomes: dict[str, Outcome]) -> ExitCode:
    """3 where a host gave no answer (what happened there is unknown), else 1 where the command
    failed or could not run somewhere, else 0."""
    if any(isinstance(o, Exception) for o in outcomes.values()):
        return ExitCode.UNREACHABLE
    if any(isinstance(o, Absent) or (isinstance(o, Answer) and o.code)
           for o in outcomes.values()):
        return ExitCode.FAILED
    return ExitCode.OK
