"""`fleet logs` of a run on hosts: every node's log read from its run directory, from the first
line (nothing lost or repeated), tagged by host and rank; with `follow`, until each node's run
ends. With a View (--merge, --tail, --since): each node's lines as they are now, with when each
was written (the time index node.times beside node.log), then followed from there."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from fleet.backends.hosts import node as remote
from fleet.console import Console
from fleet.errors import RemoteCommandError
from fleet.facts import run_state
from fleet.nodeside import shell_program
from fleet.run.logs import Tagged, Tagger, View, merged, parse_view, placed, reread_tail
from fleet.run.record import NodeRecord, RunRecord
from fleet.states import NodeStatus
from fleet.transport import Received, Transport, open_transport
from fleet.transport.group import each, reason


def attach(record: RunRecord, console: Console, follow: bool, view: View,
           node: str | None = None, rank: int | None = None,
           keep: Path | None = None) -> tuple[dict[str, str], int]:
    """Print a run's logs from every node (from the first line: nothing lost or repeated, or
    as `view` asks), and with `follow` until each node's run ends. Returns per host a problem,
    if any, and how many lines were printed."""
    nodes = [n for n in record.nodes if node is None or n.host.name == node]
    console.hosts([n.host.name for n in nodes])
    index = {n.host.name: i for i, n in enumerate(record.nodes)}
    shown = [0]
    lock = threading.Lock()

    def show(name: str, tagged: list[Tagged]) -> None:
        tagged = [tg for tg in tagged if rank is None or tg.rank == rank]
        with lock:
            shown[0] += len(tagged)
        console.lines(index[name], [(tg.tag, tg.text) for tg in tagged], name,
                      [tg.rank for tg in tagged])

    if not view.plain:
        return _attach_view(record, console, nodes, follow, view, show), shown[0]

    reaching = _Reaching(console, [n.host.name for n in nodes])

    def one(n: NodeRecord) -> int:
        copy = open(keep / f"{n.host.name}.log", "w") if keep else None  # noqa: SIM115
        try:
            with reaching.node(n.host.name), open_transport(n.host) as t:
                reaching.on(n.host.name, "its run's state")
                run_dir, st = _state(t, record, n)
                tag = _tagger(t, n, run_dir)
                reaching.ready(n.host.name)

                def on_lines(lines: list[str]) -> None:
                    if copy:
                        copy.write("".join(line + "\n" for line in lines))
                    show(n.host.name, list(map(tag, lines)))

                pid = st.pid if follow and not st.done else None
                return remote.follow(t, run_dir, pid, on_lines)
        finally:
            if copy:
                copy.close()

    try:
        results = each(((n.host.name, n) for n in nodes), one)
    finally:
        reaching.close()
    return {name: reason(r) for name, r in results.items() if isinstance(r, Exception)}, shown[0]


class _Reaching:
    """The wait until every node's log is reached (connected, its state read): on a terminal
    the count and the slow nodes, gone once the last one is reached or failed, while the lines
    of the nodes reached already print above it."""

    def __init__(self, console: Console, names: list[str]) -> None:
        self._cm = console.hosts_waiting("reaching each node's log", names)
        self.wait = self._cm.__enter__()
        self._left, self._lock, self._closed = set(names), threading.Lock(), False

    @contextlib.contextmanager
    def node(self, name: str) -> Iterator[None]:
        """A node's part: on its connection at first; reached however it ends."""
        self.wait.start(name, "its connection")
        try:
            yield
        finally:
            self.ready(name)

    def on(self, name: str, doing: str) -> None:
        self.wait.start(name, doing)

    def ready(self, name: str) -> None:
        self.wait.finish(name)
        with self._lock:
            self._left.discard(name)
            last = not self._left
        if last:
            self.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._cm.__exit__(None, None, None)


def _state(t: Transport, record: RunRecord, n: NodeRecord) -> tuple[str, run_state.NodeState]:
    run_dir = t.path(n.run_dir)
    st = run_state.state(t, run_dir, record.stop_key(n.host.name))
    if st.status is NodeStatus.MISSING:
        raise FileNotFoundError(f"no run directory {run_dir}")
    return run_dir, st


def _tagger(t: Transport, n: NodeRecord, run_dir: str) -> Tagger:
    return Tagger(n.host.name, n.rank_base, lambda: run_state.ranks(t, run_dir))


def view_script(run_dir: str, since: float | None, tail: int | None) -> str:
    """The node's log as it is now, each line with when it was written (by the node's clock),
    only lines written at or after `since` (the node's clock), only the `tail` last of them
    (fleet/nodeside/log_view.sh; fleet.run.logs.parse_view reads it)."""
    return shell_program("log_view.sh", run_dir, "" if since is None else f"{since:.3f}",
                         "" if tail is None else tail)


class _Seen:
    """One node's lines as they were when asked (times on this machine's clock), where its
    follower resumes, and what to say of its times under --merge or --since ("": nothing)."""

    def __init__(self, lines: list[tuple[float, Tagged]], end: int, pid: int | None,
                 note: str) -> None:
        self.lines, self.end, self.pid, self.note = lines, end, pid, note


UNTIMED = ("its log has no times (no node.times beside it: an earlier fleet started the run, or "
           "the node's python could not keep them): --merge and --since take its lines as "
           "written by now")


def _attach_view(record: RunRecord, console: Console, nodes: list[NodeRecord], follow: bool,
                 view: View, show: Callable[[str, list[Tagged]], None]) -> dict[str, str]:
    """Each node's lines as they are now (merged by time, or node by node as each comes), then
    with `follow` what they print from there until each node's run ends."""
    def look(n: NodeRecord) -> _Seen:
        with reaching.node(n.host.name), open_transport(n.host) as t:
            reaching.on(n.host.name, "its log")
            run_dir, st = _state(t, record, n)
            since = None if view.since is None else view.since + t.clock_offset
            r = t.run(view_script(run_dir, since, view.tail), timeout=300,
                      what="read the run's log")
            if not r.ok:
                raise RemoteCommandError(n.host.name, "read the run's log", r.code, r.err)
            seen = parse_view(r.out)
            cut = ""
            if seen.distrusted and since is not None:
                # The node chose the lines by times it cannot vouch for: its last lines, then
                # (bounded: one bad stamp does not fetch a long log whole).
                cut = (f" (at most its last {reread_tail(None)} lines)" if view.tail is None
                       else "")
                r = t.run(view_script(run_dir, None, reread_tail(view.tail)), timeout=300,
                          what="read the run's log")
                if not r.ok:
                    raise RemoteCommandError(n.host.name, "read the run's log", r.code, r.err)
                seen = parse_view(r.out)
            tag = _tagger(t, n, run_dir)
            lines = [(when, tag(line)) for when, line in placed(seen, t.clock_offset)]
            if not view.merge:
                show(n.host.name, [tg for _, tg in lines])
            note = (f"its log's time index (node.times, which the job can write too) is set "
                    f"aside: {seen.distrusted}; --merge and --since take its lines as written "
                    f"by now{cut}" if seen.distrusted else
                    UNTIMED if seen.lines and all(when is None for when, _ in seen.lines)
                    else "")
            return _Seen(lines, seen.end, st.pid if follow and not st.done else None, note)

    reaching = _Reaching(console, [n.host.name for n in nodes])
    try:
        looked = each(((n.host.name, n) for n in nodes), look)
    finally:
        reaching.close()
    seen = {name: r for name, r in looked.items() if isinstance(r, _Seen)}
    if view.merge:
        stream = merged([[(when, (name, tg)) for when, tg in s.lines]
                         for name, s in seen.items()], view.tail)
        for name, group in itertools.groupby(stream, key=lambda x: x[0]):
            show(name, [tg for _, tg in group])
    for name, s in seen.items():
        if s.note and (view.merge or view.since is not None):
            console.phase(name, s.note)

    def go_on(n: NodeRecord) -> int:
        s = seen[n.host.name]
        with open_transport(n.host) as t:
            run_dir = t.path(n.run_dir)
            tag = _tagger(t, n, run_dir)

            def on_lines(lines: list[str]) -> None:
                if view.since is None or time.time() >= view.since:
                    show(n.host.name, list(map(tag, lines)))

            return remote.follow(t, run_dir, s.pid, on_lines, received=Received(s.end))

    followed = each(((n.host.name, n) for n in nodes
                     if n.host.name in seen and seen[n.host.name].pid is not None), go_on)
    return {name: reason(r) for name, r in (looked | followed).items()
            if isinstance(r, Exception)}
