"""A user's command on a node (`fleet exec`): the script that runs it (fleet/nodeside/exec.sh)
with the env and in the directory asked for, and the pure parser of what came back."""

from __future__ import annotations

from dataclasses import dataclass

from fleet.nodedata import number
from fleet.nodeside import shell_program
from fleet.shell import Raw, home_word, quote

CAP = 65536  # bytes of a host's output shown; what comes after is counted, not shown


@dataclass(frozen=True)
class Answer:
    """What the command gave on one host: its output (stdout and stderr merged as they came,
    the first CAP bytes), its exit status, and how many bytes came after the cut."""

    output: str
    code: int
    cut: int = 0


@dataclass(frozen=True)
class Absent:
    """The directory the command was to run in is not on the host: nothing ran there."""

    directory: str
    hint: str = ""  # what would put it there


Outcome = Answer | Absent | Exception  # per host; an exception: why no answer came


def command_script(argv: list[str], directory: str, env: dict[str, str], mark: str,
                   raw_env: frozenset[str] = frozenset()) -> str:
    """sh text: `env` exported (a name in `raw_env` has a node path as its value, its leading ~
    the node's home), then argv in `directory` (~ likewise), each word quoted once. The values
    travel in the script on the shell's stdin, never on a command line."""
    exports = [f"export {name}={home_word(value) if name in raw_env else quote(value)}"
               for name, value in env.items()]
    return "\n".join([*exports, shell_program("exec.sh", Raw(home_word(directory)), CAP, mark,
                                              *argv)])


def parse_answer(out: str, err: str, mark: str, directory: str,
                 hint: str = "") -> Answer | Absent | None:
    """What exec.sh printed (its stdout, its stderr); None where no exit status came back (the
    shell was killed before the command ended). `hint`: what puts the directory there."""
    words = err.split()
    if words[-1:] == ["absent"]:
        return Absent(directory, hint)
    if len(words) < 2 or words[-2] != "status" or (code := number(words[-1])) is None:
        return None
    at = out.rfind(f"\n{mark} ")
    if at < 0:
        return None
    cut = number(out[at + len(mark) + 2:].strip())
    return Answer(out[:at], code, cut or 0)
