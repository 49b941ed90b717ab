"""The claim on each host: from before anything of a launch is written until its nodes have
started, one `fleet up` at a time prepares a machine (two launches at once would sync into the
same code directory and meet at the same rendezvous). The claim is a lock held by a script on
the node (fleet/nodeside/claim.sh) for as long as fleet keeps its channel open: a fleet that
dies releases it with its connection. Once it holds the host, the script runs what the launch
asks next (its probe) in the same round trip, between two marker lines (`section`)."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from fleet.config.inventory import Host
from fleet.console import Console
from fleet.errors import HostsBusy, TransportError, host_error
from fleet.nodeside import shell_program
from fleet.shell import Raw, home_word
from fleet.transport import Transport
from fleet.transport.group import each
from fleet.transport.trace import note

ANSWER_S = 30.0  # how long a node may take to say whether it could be claimed
THEN_S = 60.0  # how long the script run once claimed (the probe) may take after the answer
THEN_LINES = 20_000  # lines kept of what it prints (a node's word: bounded)


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


def claim_script(workdir: str, run_id: str, then: str = "") -> str:
    return shell_program("claim.sh", Raw(home_word(workdir)), run_id, then)


def marked(script: str, mark: str) -> str:
    """`script` between the marker lines `section` looks for."""
    return f"echo {mark}-begin\n{script}\necho {mark}-end"


def section(lines: list[str], mark: str) -> str | None:
    """What `marked(script, mark)` printed: the lines between its markers (None until the end
    marker came). Anything before the first marker (the claim's answer, rc noise) is not its."""
    begin, end = f"{mark}-begin", f"{mark}-end"
    inside: list[str] | None = None
    for line in lines:
        if inside is None:
            if line.strip() == begin:
                inside = []
        elif line.strip() == end:
            return "\n".join(inside)
        else:
            inside.append(line)
    return None


@dataclass(frozen=True)
class Said:
    """What the script run once claimed printed, and when: the stream began at `sent`, its end
    marker came at `received` (time.time())."""

    text: str
    sent: float
    received: float


class Claim:
    """One host's claim: the script's channel, kept open by a thread until release()."""

    def __init__(self, t: Transport, host: Host, run_id: str, then: str = "") -> None:
        self.t, self.host = t, host
        self.stop = threading.Event()
        self.answered = threading.Event()
        self.answer: Answer | None = None
        self.problem: Exception | None = None
        self.mark = f"fleet-then-{secrets.token_hex(8)}" if then else ""
        self.lines: list[str] = []  # what came after the answer, up to then's end marker
        self.said: Said | None = None
        self.ended = threading.Event()  # then's end marker came, or the stream ended
        self.sent = time.time()
        script = claim_script(host.workdir, run_id, marked(then, self.mark) if then else "")
        self.thread = threading.Thread(target=self._hold, args=(script,), daemon=True)

    def _hold(self, script: str) -> None:
        def on_lines(lines: list[str]) -> None:
            for line in lines:
                if self.answer is None:
                    if (a := parse_answer(line)) is not None:
                        self.answer = a
                        self.answered.set()
                elif self.said is None and self.mark and len(self.lines) < THEN_LINES:
                    self.lines.append(line)
                    if line.strip() == f"{self.mark}-end":
                        text = section(self.lines, self.mark)
                        self.said = Said(text or "", self.sent, time.time())
                        self.ended.set()
                        note(self.host.name, "answer", "the probe, in the claim's stream",
                             self.sent, self.said.received - self.sent)

        try:
            self.sent = time.time()
            self.t.stream(script, on_lines, self.stop)
        except Exception as e:  # the connection's loss is the caller's to report
            self.problem = e
        finally:
            self.answered.set()
            self.ended.set()

    def take(self) -> Answer:
        self.thread.start()
        if not self.answered.wait(ANSWER_S):
            raise TransportError(f"no answer to fleet's claim in {ANSWER_S:.0f}s")
        if self.answer is None:
            raise self.problem or TransportError("the claim script ended without an answer")
        return self.answer

    def then_said(self) -> Said:
        """What the script run once claimed printed (after take() answered claimed or
        unsupported)."""
        if not self.ended.wait(THEN_S):
            raise TransportError(f"no answer to fleet's probe in {THEN_S:.0f}s")
        if self.said is None:
            raise self.problem or TransportError("the claim script ended before the probe did")
        return self.said

    def release(self) -> None:
        self.stop.set()
        self.thread.join(5)


class Claims:
    """Every host's claim of one launch; release() (idempotent) lets other launches in."""

    def __init__(self, claims: list[Claim]) -> None:
        self.claims = claims
        self.said: dict[str, Said] = {}  # per host, what the script run once claimed printed

    def release(self) -> None:
        each(((c.host.name, c) for c in self.claims), Claim.release)
        self.claims = []


def claim_all(session: dict[str, Transport], hosts: tuple[Host, ...], run_id: str,
              console: Console, then: dict[str, str] | None = None,
              done: Callable[[str], None] = lambda name: None) -> Claims:
    """Claim every host at once; a host that another launch holds stops this one (HostsBusy,
    exit 6) before anything is written, naming the holder. `then`: per host a script each
    claim runs once it holds its host, in the same round trip (Claims.said: what it printed);
    `done(host)` once a host's part is over (what a wait says)."""
    claims = [Claim(session[h.name], h, run_id, (then or {}).get(h.name, "")) for h in hosts]
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
    if then:
        def heard(c: Claim) -> Said:
            try:
                return c.then_said()
            finally:
                done(c.host.name)

        said = each(((c.host.name, c) for c in claims if c.mark), heard)
        if bad := {name: r for name, r in said.items() if isinstance(r, Exception)}:
            held.release()
            raise host_error("probing", bad)
        held.said = {name: r for name, r in said.items() if isinstance(r, Said)}
    return held
