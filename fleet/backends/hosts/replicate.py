"""Checkpoints that survive their host (`[restart] checkpoints`): while an attempt runs, a thread
of `fleet up` polls each node's checkpoint directory, and copies each file that settled from the
node that wrote it to the run's other nodes and the free spares (so that they are warm); before
a restart, every node of the new host list gets the newest file any survivor holds. A copy is
one file at a time, read from its node at a bounded rate, fetched to this machine and verified
(sha256 on both ends), then sent on by the relay (the nodes pass it on to each other) and
verified again on each node; what the job prunes of its own is pruned of fleet's copies. What
fleet saw is recorded here (fleet.run.checkpoints)."""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fleet.backends.hosts.run import with_spares
from fleet.config.inventory import Host
from fleet.config.job import Job
from fleet.config.select import load_selected
from fleet.console import Console
from fleet.errors import FleetError, TransportError
from fleet.facts import checkpoints as fact
from fleet.nodeside.shared import nodemap
from fleet.run import checkpoints as book
from fleet.run import record as state
from fleet.shell import sh
from fleet.transport import Transport, open_transport
from fleet.transport.group import each
from fleet.transport.sync import Scan
from fleet.transport.transfer import Dir, Target, fetch, human, move
from fleet.transport.transfer.wanted import Want
from fleet.waits import named

POLL_S = 2.0  # between two looks at the nodes' checkpoint directories
RATE = 64 << 20  # bytes a second read from a training node: the job's disk and link come first
LIST_S = 15.0  # one listing's limit: a node that does not answer in it is left for this poll
PAUSE_S = 2.0  # the most a restart waits for the watch's thread to end
SETTLE_S = 1.0  # before a restart: a file unchanged this long after the job's end is whole
STAGE = "checkpoint-"  # in the run's record: a file on its way, removed after each copy


class Stopped(Exception):
    """The keeper was told to stop during a copy."""


class Keeper:
    """The run's checkpoint copies: watch() during an attempt, ready() before the next one."""

    def __init__(self, job: Job, console: Console, run_id: str) -> None:
        self.job, self.console = job, console
        self.ckpt = job.restart.checkpoints
        self.dir = state.state_dir() / run_id
        self.kept = book.load(self.dir)
        self.inventory = load_selected(job.inventory, job.selection)
        self.conns: dict[str, Transport] = {}
        self.nodes: list[Host] = []  # the attempt's, then the free spares
        self.before: dict[str, dict[str, fact.Seen]] = {}
        self.done = threading.Event()
        self.thread: threading.Thread | None = None
        self.quiet = Console(out=io.StringIO(), err=io.StringIO(), live=False)
        self.said: set[str] = set()

    # ---- the seam's verbs (fleet.backends.answers.Replicas) --------------------------------
    def ready(self, attempt: int, replace: dict[str, str], lost: list[str]) -> None:
        """Before attempt `attempt` (on the hosts `replace` makes): the watch of the one
        before ends; from the second on, every node holds the newest checkpoint a survivor
        has (or fleet says there is none); then the watch of this one begins."""
        self.pause()
        inv = with_spares(self.inventory, replace)
        self.nodes = [*inv.hosts, *inv.spares]
        if attempt > 1:
            self.restore(list(inv.hosts), set(lost), attempt)
        self.before = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._keep, args=(self.done,), daemon=True,
                                       name="fleet-ckpt")
        self.thread.start()

    def pause(self) -> None:
        """The watch ends. A look at a node that does not answer is not waited for (a restart
        is not held by it): that thread changes nothing once it returns."""
        self.done.set()
        if self.thread is not None:
            self.thread.join(PAUSE_S)
            self.thread = None

    def close(self) -> None:
        self.pause()
        for t in self.conns.values():
            t.close()
        self.conns.clear()

    # ---- while an attempt runs ------------------------------------------------------------
    def _keep(self, done: threading.Event) -> None:
        while not done.wait(POLL_S):
            try:
                self.poll(done)
            except Stopped:
                return
            except Exception as e:  # noqa: BLE001 - the run goes on; said once, tried again
                self._once(f"checkpoint: copying stopped for now ({e})")

    def poll(self, done: threading.Event | None = None) -> None:
        """One look at every node, then the copies and prunes it calls for."""
        done = done or threading.Event()
        listings = self._listings(self.nodes)
        if done.is_set():
            raise Stopped
        settled = {n: fact.settled(self.before.get(n), files) for n, files in listings.items()}
        self.before.update(listings)
        copies = book.fresh(self.kept, settled, listings)
        for rel, nodes in book.pruned(self.kept, listings).items():
            for n in nodes:
                self._remove(n, rel)
        book.save(self.dir, self.kept)
        for c in copies:
            if done.is_set():
                raise Stopped
            try:
                secs = self._copy(c.kept, c.source, list(c.targets), throttle=done)
            except (FleetError, OSError) as e:  # gone meanwhile (pruned), or a node away
                self._drop(c.source)
                self._once(f"checkpoint {self._name(c.kept)} not copied from {c.source} ({e}); "
                           "tried again while it is there")
                continue
            self.console.info(self._words(c.kept, c.source, list(c.targets), secs))
            book.save(self.dir, self.kept)

    # ---- before an attempt ----------------------------------------------------------------
    def restore(self, hosts: list[Host], lost: set[str], attempt: int) -> None:
        """Every node of `hosts` holds the newest checkpoint a survivor has (the nodes the last
        attempt lost are not asked), or fleet says plainly that there is none."""
        asked = [h for h in self._all() if h.name not in lost]
        listings = self._listings(asked, shown=True)
        settled = {n: fact.settled(self.before.get(n), files) for n, files in listings.items()}
        if any(settled[n] != files for n, files in listings.items()):
            # Written since the last look (or a node not looked at yet): the job is stopped,
            # so what has not changed a moment later is whole, and may be the newest.
            with self.console.waiting("checkpoint: files written since the last look, looked "
                                      f"at again in {SETTLE_S:g} s (unchanged: whole)"):
                time.sleep(SETTLE_S)
            first, listings = listings, self._listings(asked, shown=True)
            settled = {n: fact.settled(first.get(n), files) for n, files in listings.items()}
        book.fresh(self.kept, settled, listings)
        k, holders = book.newest_held(self.kept, listings)
        scratch = f"attempt {attempt} starts from scratch"
        if k is None:
            seen = max(self.kept.values(), key=lambda k: k.mtime_ns, default=None)
            self.console.info(
                f"checkpoint: no node left holds one in {self.ckpt}/ (the newest fleet saw, "
                f"{self._name(seen)}, was on {', '.join(seen.holders)}): {scratch}"
                if seen else f"checkpoint: none was written in {self.ckpt}/: {scratch}")
            book.save(self.dir, self.kept)
            return
        lacking = [h.name for h in hosts if h.name not in holders]
        if not lacking:
            self.console.info(f"checkpoint {self._name(k)} ({human(k.size)}) is on every node "
                              "already")
        else:
            source = k.writer if k.writer in holders else holders[0]
            try:
                with self.console.waiting(f"checkpoint {self._name(k)} ({human(k.size)}): "
                                          f"copying from {source} to {', '.join(lacking)}"):
                    secs = self._copy(k, source, lacking, throttle=None)
            except (FleetError, OSError) as e:
                self.console.info(f"checkpoint {self._name(k)} could not be copied from "
                                  f"{source} to {', '.join(lacking)} ({e}): {scratch} there")
            else:
                self.console.info(self._words(k, source, lacking, secs))
        book.save(self.dir, self.kept)

    # ---- one copy -------------------------------------------------------------------------
    def _copy(self, k: book.Kept, source: str, targets: list[str],
              throttle: threading.Event | None) -> float:
        """k's file from `source` to `targets`: fetched here (the node hashed what it sent, this
        machine what it received), then relayed to the targets (each hashed what it wrote);
        every hash the same, else FleetError. Lands 0600, with the job's own mtime. With
        `throttle` (the watch's end), read at RATE at most. Seconds."""
        began = time.monotonic()
        by = {h.name: h for h in self._all()}
        stage = Path(tempfile.mkdtemp(prefix=STAGE, dir=self.dir))
        try:
            src = by[source]
            got = fetch(self._conn(src), src.python, self._job_dir(src),
                        [Want(k.rel, k.size)], stage,
                        self._throttle(throttle) if throttle is not None else None)
            sha = got.get(k.rel)
            path = stage / k.rel
            if sha is None or not path.is_file() or path.stat().st_size != k.size:
                raise TransportError(f"{source} did not send {k.rel} (gone, or changed since "
                                     "it was listed)")
            os.chmod(path, 0o600)  # never the node's mode: the job's data, for the job alone
            os.utime(path, ns=(k.mtime_ns, k.mtime_ns))
            nodes = []
            for name in targets:
                h = by[name]
                t = self._conn(h)
                parent = str(Path(self._job_dir(h), k.rel).parent)
                t.run(sh("mkdir", "-p", parent), timeout=LIST_S, what="make the checkpoint "
                      "directory").check(name)
                nodes.append(Target(name, t, h.python, h.address, (self._job_dir(h),)))
            scan = Scan(stage, {k.rel: path}, {k.rel: (k.size, k.mtime_ns)})
            out, _ = move(nodes, [Dir(scan, {n: self._job_dir(by[n]) for n in targets},
                                      {n: {} for n in targets},
                                      {n: [k.rel] for n in targets})], self.quiet)
            wrong = [n for n in targets if out.placed.get(n, {}).get((0, k.rel)) != sha]
            if wrong:
                raise TransportError(f"{', '.join(wrong)}: {k.rel} did not verify")
            k.sha256 = sha
            k.holders = sorted({*k.holders, source, *targets})
            return time.monotonic() - began
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def _throttle(self, done: threading.Event) -> Callable[[int], None]:
        began, sent = time.monotonic(), [0]

        def received(n: int) -> None:
            if done.is_set():
                raise Stopped
            sent[0] += n
            ahead = sent[0] / RATE - (time.monotonic() - began)
            if ahead > 0:
                time.sleep(ahead)
        return received

    def _remove(self, node: str, rel: str) -> None:
        h = next((h for h in self._all() if h.name == node), None)
        if h is None:
            return
        try:
            self._conn(h).run(sh("rm", "-f", "--", f"{self._job_dir(h)}/{rel}"), timeout=LIST_S,
                              what="prune a checkpoint copy")
        except FleetError:
            self._drop(node)

    # ---- nodes ----------------------------------------------------------------------------
    def _all(self) -> list[Host]:
        return [*self.inventory.hosts, *self.inventory.spares]

    def _job_dir(self, h: Host) -> str:
        return self._conn(h).path(nodemap.code_dir(h.workdir, self.job.slot))

    def _conn(self, h: Host) -> Transport:
        t = self.conns.get(h.name)
        if t is None:  # each host's own thread opens it (_listings): no two race for one
            t = self.conns[h.name] = open_transport(h)
        return t

    def _drop(self, name: str) -> None:
        t = self.conns.pop(name, None)
        if t is not None:
            t.close()

    def _listings(self, hosts: list[Host], shown: bool = False
                  ) -> dict[str, dict[str, fact.Seen]]:
        """Each node's checkpoint files, asked of all at once; a node that cannot be asked now
        is left out. `shown`: a wait the person sees (before an attempt; the watch's own looks,
        while the job prints, are not)."""
        def ask(h: Host) -> dict[str, fact.Seen] | None:
            r = self._conn(h).run(fact.command(h.python, self._job_dir(h), self.ckpt),
                                  timeout=LIST_S, what="list the checkpoints")
            return fact.parse(r.out, self.ckpt).files if r.ok else None
        out = {}
        console = self.console if shown else self.quiet
        with console.hosts_waiting("the checkpoints each node holds",
                                   (h.name for h in hosts)) as wait:
            asked = each(named((h.name, h) for h in hosts), wait.tracked(ask))
        for name, got in asked.items():
            if isinstance(got, FleetError):
                self._drop(name)
            elif isinstance(got, Exception):
                raise got
            elif got is not None:
                out[name] = got
        return out

    # ---- words ----------------------------------------------------------------------------
    def _name(self, k: book.Kept | None) -> str:
        return "" if k is None else k.rel[len(self.ckpt) + 1:]

    def _words(self, k: book.Kept, source: str, targets: list[str], secs: float) -> str:
        return (f"checkpoint {self._name(k)} ({human(k.size)}) from {source} to "
                f"{', '.join(targets)}, {secs:.1f} s")

    def _once(self, words: str) -> None:
        if words not in self.said:
            self.said.add(words)
            self.console.info(words)
