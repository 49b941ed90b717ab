"""Following a Slurm job through the login node: every node's log from its first line, tagged by
node and rank, Slurm's own words when the job's state changes, until the job ends."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Generator

from fleet.backends.base import Quiet
from fleet.backends.slurm.jobs import SlurmRecord, job_info, node_infos
from fleet.console import Console, Waiting
from fleet.errors import (
    FleetError,
)
from fleet.events import Line
from fleet.facts import slurm as sj
from fleet.run.logs import Tagger
from fleet.shell import sh
from fleet.states import RunStatus
from fleet.transport import Partial, Transport
from fleet.transport.group import reason

POLL_S = 1.0
DETACH_WAIT_S = 600.0  # how long `fleet up --detach` waits for every node to start



# ---- following the nodes' logs ------------------------------------------------------------
class Follower:
    """One log file on the shared filesystem, streamed through the login node from its first
    line; after the job ended, `drain` prints what the stream had not yet delivered."""

    def __init__(self, t: Transport, path: str, on_line: TaggedSink) -> None:
        self.t, self.path, self.on_line = t, path, on_line
        self.count = 0
        self.last = time.monotonic()  # when its last line came (the hang watchdog's clock)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _lines(self, lines: list[str]) -> None:
        with self.lock:
            if self.stop.is_set():
                return
            self.count += sum(not isinstance(line, Partial) for line in lines)  # log lines
            self.last = time.monotonic()
            for line in lines:
                self.on_line(line)

    def _run(self) -> None:
        # exec: the stream's kill reaches tail itself, never leaving it behind
        with contextlib.suppress(FleetError, OSError):
            self.t.stream("exec " + sh("tail", "-n", "+1", "-F", "-s", "0.2", self.path)
                          + " 2>/dev/null", self._lines, self.stop)

    def halt(self) -> None:
        """No more lines from the stream (drain reads the rest)."""
        with self.lock:
            self.stop.set()

    def drain(self) -> None:
        self.halt()
        self.thread.join(timeout=10)
        r = self.t.run(sh("tail", "-n", f"+{self.count + 1}", self.path) + " 2>/dev/null",
                       timeout=60, what="read the end of a log")
        for line in r.out.splitlines():
            self.on_line(line)


class TaggedSink:
    """A node's lines to the console, tagged `node rN` once its first line said its rank."""

    def __init__(self, console: Console, node: str, index: int, nproc: int | str,
                 static: bool, only_rank: int | None = None) -> None:
        self.console, self.node, self.index = console, node, index
        self.nproc, self.static, self.only_rank = nproc, static, only_rank
        self.tagger: Tagger | None = None
        self.node_rank: int | None = None
        self.shown = 0

    def __call__(self, line: str) -> None:
        if self.tagger is None:
            m = sj.ANNOUNCE.search(line)
            if m:
                self.node_rank = int(m.group(2))
            base = self.node_rank * self.nproc if self.node_rank is not None and \
                self.static and isinstance(self.nproc, int) else None
            self.tagger = Tagger(self.node, base)
        tagged = self.tagger(line)
        if self.only_rank is None or tagged.rank == self.only_rank:
            self.shown += 1
            self.console.event(Line(self.node, tagged.rank, tagged.text, tagged.tag, self.index))


class Announcer:
    """Says where a job stands while it is not over (PENDING and Slurm's reason, RUNNING and
    its nodes): at the first look, then only when it changes, never once per poll; on a
    terminal, a spinner while it waits in the queue. The job's end is for the report to say."""

    def __init__(self, console: Console, job_id: str) -> None:
        self.console, self.job_id = console, job_id
        self.said = ""
        self.queued = contextlib.ExitStack()  # the spinner of its wait in the queue, if shown
        self.wait: Waiting | None = None

    def __call__(self, info: sj.JobInfo | None) -> None:
        if info is None or info.status is not RunStatus.STARTING:
            self.close()
        if info is None or info.status.is_terminal:
            return
        words = sj.state_words(info)
        if words != self.said:
            self.console.phase("slurm", f"job {self.job_id} is {words}")
            self.said = words
        if info.status is RunStatus.STARTING:
            text = f"job {self.job_id} is {words}"
            if self.wait is None:
                self.wait = self.queued.enter_context(self.console.waiting(text))
            self.wait.update(text)

    def close(self) -> None:
        """The queue's spinner ended (the job left the queue, or fleet stops watching)."""
        self.queued.close()
        self.wait = None


class Watch:
    """Every node's log (and Slurm's own output, tagged `slurm`) from the first line; with
    `follow`, until the job ends, `announce` told of Slurm's every answer on the way. `info`
    is Slurm's last word on the job, `shown()` the lines printed."""

    def __init__(self, t: Transport, rec: SlurmRecord, console: Console, follow: bool = True,
                 node: str | None = None, rank: int | None = None,
                 announce: Callable[[sj.JobInfo | None], None] | None = None) -> None:
        self.t, self.rec, self.console, self.follow = t, rec, console, follow
        self.node, self.rank, self.announce = node, rank, announce
        self.followers: dict[str, Follower] = {}
        self.sinks: dict[str, TaggedSink] = {}
        self.info: sj.JobInfo | None = None

    def _add(self, name: str, path: str) -> None:
        if name in self.followers or (self.node is not None and name not in (self.node, "slurm")):
            return
        if self.rank is not None and name == "slurm":
            return
        self.sinks[name] = TaggedSink(self.console, name, len(self.sinks), self.rec.nproc,
                                      self.rec.static, self.rank)
        self.followers[name] = Follower(self.t, path, self.sinks[name])

    def _add_nodes(self) -> None:
        for name in node_infos(self.t, self.rec.run_dir):
            self._add(name, f"{self.rec.run_dir}/{name}/node.log")

    def events(self) -> Generator[Quiet, None, None]:
        """A Quiet at each poll: how long no line came while the job ran (0 while it waits in
        the queue, which is not silence); every log drained at the end."""
        t, rec = self.t, self.rec
        self._add("slurm", f"{rec.run_dir}/batch.log")
        running_since: float | None = None
        try:
            while True:
                self.info = info = job_info(t, rec.job_id) if rec.job_id else None
                self._add_nodes()
                if not self.follow or info is None or info.status.is_terminal:
                    break
                if self.announce is not None:
                    self.announce(info)
                silent = 0.0
                if info.status is RunStatus.RUNNING:
                    now = time.monotonic()
                    running_since = running_since or now
                    silent = now - max([running_since,
                                        *(f.last for f in self.followers.values())])
                yield Quiet(silent)
                time.sleep(POLL_S)
            self._add_nodes()  # the nodes whose log appeared while the job ended
        finally:
            if isinstance(self.announce, Announcer):
                self.announce.close()
            for f in self.followers.values():  # every stream stopped first: none runs on
                f.halt()
            for name, f in self.followers.items():
                try:
                    f.drain()
                except FleetError as e:  # said; never in place of what ended the watch
                    self.console.phase(name, f"the end of its log could not be read: "
                                             f"{reason(e)}")

    def shown(self) -> int:
        return sum(s.shown for s in self.sinks.values())


def watch(t: Transport, rec: SlurmRecord, console: Console, follow: bool = True,
          node: str | None = None, rank: int | None = None,
          announce: Callable[[sj.JobInfo | None], None] | None = None,
          ) -> tuple[sj.JobInfo | None, int]:
    """Watch(...) to its end: Slurm's last word on the job and the lines shown."""
    w = Watch(t, rec, console, follow, node, rank, announce)
    for _ in w.events():
        pass
    return w.info, w.shown()



def wait_started(t: Transport, rec: SlurmRecord, nodes: int,
                 announce: Callable[[sj.JobInfo | None], None],
                 timeout: float = DETACH_WAIT_S) -> tuple[sj.JobInfo | None, int]:
    """Until every node has started its part of the job (its log's first line: the script's
    preflight passed there), or the job ended, or `timeout` passed (Slurm keeping the job
    pending, a node slow to start); `announce` told of Slurm's every answer on the way.
    Returns Slurm's last word and how many nodes had started."""
    assert rec.job_id is not None
    deadline = time.monotonic() + timeout
    try:
        while True:
            info = job_info(t, rec.job_id)
            announce(info)
            running = info is not None and info.status is RunStatus.RUNNING
            started = len(node_infos(t, rec.run_dir)) if running else 0
            if info is None or info.status.is_terminal or started >= nodes or \
                    time.monotonic() > deadline:
                return info, started
            time.sleep(0.5)
    finally:
        if isinstance(announce, Announcer):
            announce.close()

