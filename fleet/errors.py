"""The one error tree of fleet; the CLI turns each class into a message and an exit code."""

from __future__ import annotations

import re
from collections import Counter
from enum import IntEnum


class ExitCode(IntEnum):
    """fleet's exit codes, one meaning each (docs/USAGE.md lists them)."""

    OK = 0
    FAILED = 1  # the job (or a check) failed
    BAD_INPUT = 2  # a file, key or argument is wrong: nothing was started
    UNREACHABLE = 3  # a host could not be reached or asked: the state is unknown there
    STOPPED = 4  # the run was stopped
    NOT_READY = 5  # a host answered but is not ready for the job
    BUSY = 6  # hosts held by another run
    TAMPERED = 7  # a node altered the data it relayed to another
    INTERNAL = 70  # a bug in fleet
    INTERRUPTED = 130  # Ctrl-C, SIGTERM or SIGHUP


class FleetError(Exception):
    """Base of every error fleet reports to the user."""

    exit_code: int = ExitCode.FAILED


class ConfigError(FleetError):
    """An inventory or job file is missing, malformed, or says something impossible."""

    exit_code = ExitCode.BAD_INPUT

    def __init__(self, path: object, key: str | None, message: str) -> None:
        self.path = str(path)
        self.key = key
        where = f"{self.path}: {key}" if key else self.path
        super().__init__(f"{where}: {message}")


class UsageError(FleetError):
    """A command-line argument names nothing that exists or contradicts another."""

    exit_code = ExitCode.BAD_INPUT


class Unsupported(UsageError):
    """A backend was asked a verb it does not answer (fleet.backends.base: a role it does not
    take): one message for every backend and verb, with what to do instead where there is."""

    def __init__(self, backend: str, verb: str, instead: str = "") -> None:
        self.backend, self.verb = backend, verb
        super().__init__(f"the {backend} backend does not support {verb}"
                         + (f": {instead}" if instead else ""))


class WorkdirError(FleetError):
    """A local file that a job's workdir or data would send cannot be read."""

    exit_code = ExitCode.BAD_INPUT


class TransportError(FleetError):
    """A node cannot be reached or authenticated, or its connection was lost."""

    exit_code = ExitCode.UNREACHABLE


class PortClosed(FleetError):
    """A node refused a forwarded connection: nothing accepts connections on that port there
    (fleet forward says it per connection and keeps listening)."""

    exit_code = ExitCode.FAILED


class CommandTimedOut(FleetError):
    """A command on a node gave no result in time (the node may still be running it)."""

    exit_code = ExitCode.UNREACHABLE

    def __init__(self, host: str, what: str, seconds: float | None) -> None:
        self.host = host
        super().__init__(f"{host}: no answer to {what} after {seconds}s")


class WriteError(FleetError):
    """A file could not be written on a node in full (a full disk or quota, permissions)."""

    exit_code = ExitCode.NOT_READY


class HostError(FleetError):
    """One or more hosts answered but are not ready for the job (python or torch missing or
    different, a port taken or blocked, a full disk, absent GPUs, a step of fleet's refused);
    nothing was started. Where a host could not be reached, see HostsUnreachable."""

    exit_code = ExitCode.NOT_READY
    consequence = "; nothing was started"

    def __init__(self, action: str, failures: dict[str, str]) -> None:
        self.failures = failures
        lines = [f"{action} failed on {len(failures)} host(s){self.consequence}:"]
        lines += [f"  {', '.join(hosts)}: {reason}" for hosts, reason in said_once(failures)]
        super().__init__("\n".join(lines))


def said_once(failures: dict[str, str]) -> list[tuple[list[str], str]]:
    """Hosts that failed with the same words, said once: (the hosts, in order, and the words),
    in the order of each group's first host. A reason that starts with its own host's name
    (`node2: no answer...`) is compared, and said, without it; one that names its own host
    further on (`cannot write x on node2`) is compared with that name left out, and said of
    several hosts as `each host` (an error's own `node2: ` after a colon, as nothing).
    The very same words on several hosts are one as they are, the names they hold
    included (`the link node1 -> node2 stalled`, said by both ends). Reasons that differ in
    anything else are never one."""
    words_of = {host: reason.removeprefix(f"{host}: ") for host, reason in failures.items()}
    unnamed = {host: _unnamed(host, words) for host, words in words_of.items()}
    # The very same words, each naming its own host or none alike (both ends of a link, each
    # naming both): one as they are. node10's `... on node1` is not node1's `... on node1`.
    same = Counter((words, unnamed[host][0]) for host, words in words_of.items())
    groups: dict[tuple[str, str], list[str]] = {}
    said: dict[tuple[str, str], str] = {}
    for host, words in words_of.items():
        named, placed = unnamed[host]
        key = (("same", words) if same[(words, named)] > 1
               else ("named", placed) if named else ("plain", words))
        groups.setdefault(key, []).append(host)
        said.setdefault(key, words)
    return [(hosts, key[1].replace(f": {_HOST}: ", ": ").replace(_HOST, "each host")
             if key[0] == "named" and len(hosts) > 1 else said[key])
            for key, hosts in groups.items()]


def once(by_host: dict[str, str]) -> list[str]:
    """Each host's words as lines, the same words said once naming the hosts (said_once):
    `node1, node2: stopped`."""
    return [f"{', '.join(hosts)}: {words}" for hosts, words in said_once(by_host)]


_HOST = "\x00host\x00"  # the place of a host's own name in its words, while compared


def _unnamed(host: str, words: str) -> tuple[bool, str]:
    """The words with the host's own name (a whole name: node1 is not in node10) in a
    placeholder, and whether there was one; words that hold the placeholder itself as they
    are."""
    if not host or _HOST in words:
        return False, words
    out = re.sub(rf"(?<![\w.-]){re.escape(host)}(?![\w-]|\.\w)", _HOST, words)
    return out != words, out


class GpusTaken(HostError):
    """GPUs (or whole hosts) a job would use are leased to another user or hold another user's
    process, or `fleet up --wait` ran out of time with them still in use; nothing was
    started."""

    exit_code = ExitCode.BUSY


class HostsUnreachable(HostError):
    """One or more hosts could not be reached or authenticated, or stopped answering."""

    exit_code = ExitCode.UNREACHABLE


class RelayTampered(HostError):
    """A node passed data on to another that does not match what fleet sent (a file's bytes,
    name, size, mode, time, blocks or writers): the relaying node is compromised or faulty;
    nothing of it was applied, and nothing was started."""

    exit_code = ExitCode.TAMPERED


class HostsBusy(HostError):
    """Another fleet run still holds the hosts (`--force` shares them); nothing was started."""

    exit_code = ExitCode.BUSY


def host_error(action: str, errors: dict[str, Exception],
               kind: type[HostError] = HostError) -> HostError:
    """The error for hosts that failed `action`: HostsUnreachable where any of them could not
    be reached (what else is wrong there cannot be known), else `kind`."""
    lines = {name: str(e) if isinstance(e, FleetError) else f"{type(e).__name__}: {e}"
             for name, e in errors.items()}
    if not any(isinstance(e, TransportError | CommandTimedOut) for e in errors.values()):
        return kind(action, lines)
    if kind is HostError:
        return HostsUnreachable(action, lines)
    err = kind(action, lines)  # its own words (a start: others may have started), exit 3
    err.exit_code = HostsUnreachable.exit_code
    return err


class StartError(HostError):
    """The job could not be started on some node, after it was started on others (what was
    started is stopped by the run's guard, which says so)."""

    consequence = ""


class SetupError(HostError):
    """A job's setup script failed on some node: the job's own failure (exit 1), before
    anything started anywhere."""

    exit_code = ExitCode.FAILED


class SetupFailed(FleetError):
    """One node's setup script exited non-zero (its output's tail in the message)."""


class RemoteCommandError(FleetError):
    """A command fleet ran on a node exited non-zero (the node answered: not a lost link)."""

    exit_code = ExitCode.NOT_READY

    def __init__(self, host: str, command: str, code: int, output: str) -> None:
        self.host, self.command, self.code = host, command, code
        tail = "\n".join(output.strip().splitlines()[-10:])
        msg = f"{host}: command exited {code}: {command}"
        super().__init__(msg + (f"\n{tail}" if tail else ""))


class RunNotFound(FleetError):
    """A run id (or 'the latest run') names no run recorded in the state directory."""

    exit_code = ExitCode.BAD_INPUT


class DamagedRecord(FleetError):
    """A local run record cannot be read (truncated, edited by hand)."""

    exit_code = ExitCode.BAD_INPUT


class JobFailed(FleetError):
    """The job ran and at least one node did not succeed (3: and one could not be asked)."""

    exit_code = ExitCode.FAILED

    def __init__(self, message: str, exit_code: int = ExitCode.FAILED) -> None:
        self.exit_code = ExitCode(exit_code)
        super().__init__(message)


class RunStopped(FleetError):
    """The run was stopped (by `fleet stop`, say) while fleet followed it: not a failure."""

    exit_code = ExitCode.STOPPED


class Interrupted(BaseException):
    """fleet itself got a signal (Ctrl-C, SIGTERM, SIGHUP) and stopped what it had started.
    Like KeyboardInterrupt, not an Exception: no `except FleetError` may take it for a node's
    failure and carry on."""

    exit_code = ExitCode.INTERRUPTED

    def __init__(self, signame: str, outcome: str = "") -> None:
        self.signame = signame
        self.outcome = outcome
        super().__init__(f"interrupted ({signame})" + (f": {outcome}" if outcome else ""))


class InternalError(FleetError):
    """A bug in fleet: reported in one line (the traceback with --debug), never as a crash."""

    exit_code = ExitCode.INTERNAL


class NotEveryNode(FleetError):
    """A command about a recorded run reached some nodes but not all (each named above it):
    what it says of those is unknown."""

    exit_code = ExitCode.UNREACHABLE


class PullFailed(FleetError):
    """`fleet pull` could not bring back all it was asked for (each node's problem named above
    it: a node that no longer has the run, a path not there, a transfer broken)."""
