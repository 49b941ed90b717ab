"""The claim on each host: from before anything of a launch is written until its nodes have
started, one `fleet up` at a time prepares a machine (two launches at once would sync into the
same code directory and meet at the same rendezvous). The claim is a lock held by a script on
the node (fleet/nodeside/claim.sh) for as long as fleet keeps its channel open: a fleet that
dies releases it with its connection."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import Enum

from fleet.config.inventory import Host
from fleet.console import Console
from fleet.errors import HostsBusy, TransportError, host_error
from fleet.nodeside import shell_program
from fleet.shell import Raw, home_word
from fleet.transport import Transport
from fleet.transport.group import each

ANSWER_S = 30.0  # how long a node may take to say whether it could be claimed


class ClaimState(Enum):
    CLAIMED = "claimed"
    BUSY = "busy"  # another launch holds it
    UNSUPPORTED = "unsupported"  # no flock, or no locks on that filesystem: nothing is held


@dataclass(frozen=True)
class Answer:
    state: ClaimState
    holder: str = ""  # the run id of the launch that holds it, where busy


def parse_answer(line: str) -> Answer | None:
    """The claim script's status line (None for anything else: a keepalive, noise)."""
    word, _, rest = line.strip().partition(" ")
    try:
        state = ClaimState(word)
    except ValueError:
        return None
    holder = "".join(c for c in rest.strip() if c.isalnum() or c in "._-")[:200]
    return Answer(state, holder if state is ClaimState.BUSY else "")


def claim_script(workdir: str, run_id: str) -> str:
    return shell_program("claim.sh", Raw(home_word(workdir)), run_id)


class Claim:
    """One host's claim: the script's channel, kept open by a thread until release()."""

    def __init__(self, t: Transport, host: Host, run_id: str) -> None:
        self.t, self.host = t, host
        self.stop = threading.Event()
        self.answered = threading.Event()
        self.answer: Answer | None = None
        self.problem: Exception | None = None
        self.thread = threading.Thread(target=self._hold, args=(run_id,), daemon=True)

    def _hold(self, run_id: str) -> None:
        def on_lines(lines: list[str]) -> None:
            for line in lines:
                if self.answer is None and (a := parse_answer(line)) is not None:
                    self.answer = a
                    self.answered.set()

        try:
            self.t.stream(claim_script(self.host.workdir, run_id), on_lines, self.stop)
        except Exception as e:  # the connection's loss is the caller's to report
            self.problem = e
        finally:
            self.answered.set()

    def take(self) -> Answer:
        self.thread.start()
        if not self.answered.wait(ANSWER_S):
            raise TransportError(f"no answer to fleet's claim in {ANSWER_S:.0f}s")
        if self.answer is None:
            raise self.problem or TransportError("the claim script ended without an answer")
        return self.answer

    def release(self) -> None:
        self.stop.set()
        self.thread.join(5)


class Claims:
    """Every host's claim of one launch; release() (idempotent) lets other launches in."""

    def __init__(self, claims: list[Claim]) -> None:
        self.claims = claims

    def release(self) -> None:
        each(((c.host.name, c) for c in self.claims), Claim.release)
        self.claims = []


def claim_all(session: dict[str, Transport], hosts: tuple[Host, ...], run_id: str,
              console: Console) -> Claims:
    """Claim every host at once; a host that another launch holds stops this one (HostsBusy,
    exit 6) before anything is written, naming the holder."""
    claims = [Claim(session[h.name], h, run_id) for h in hosts]
    results = each(((c.host.name, c) for c in claims), Claim.take)
    held = Claims(claims)
    errors = {name: r for name, r in results.items() if isinstance(r, Exception)}
    if errors:
        held.release()
        raise host_error("claiming the hosts", errors)
    busy = {name: f"another `fleet up` (run {a.holder or '?'}) is preparing this host right "
                  "now; run again once it has started (then `fleet ps --hosts` shows it)"
            for name, a in results.items()
            if isinstance(a, Answer) and a.state is ClaimState.BUSY}
    if busy:
        held.release()
        raise HostsBusy("claiming the hosts", busy)
    for name, a in results.items():
        if isinstance(a, Answer) and a.state is ClaimState.UNSUPPORTED:
            console.phase(name, "warning: cannot hold a lock here (no `flock`, or a "
                                "filesystem without locks): another launch at the same time "
                                "would not be kept out")
    return held
