"""Sending a run's files: the code and data synced (once per shared filesystem, streamed and
relayed where large), the rendered scripts written, the port checks beside; nothing runs yet."""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass

from fleet.backends.hosts.ports import Listeners
from fleet.backends.hosts.prepare import Session, preflight
from fleet.config.job import Job
from fleet.console import Console
from fleet.errors import ConfigError
from fleet.events import Transfer
from fleet.nodeside.ferry import part_name
from fleet.plan import SITE, NodePlan, Plan
from fleet.render import render_node
from fleet.run import faults
from fleet.shell import sh
from fleet.sizes import sent_to as sizes_sent_to
from fleet.transport import ignore, prune, transfer
from fleet.transport.group import all_ok, each
from fleet.transport.sync import (
    Entry,
    Scan,
    changed,
    code_entries,
    listing_script,
    parse_listing,
    scan,
)
from fleet.transport.sync import send as send_bundle
from fleet.waits import Pending

SYNCED = ".fleet-synced"  # in a node's code directory: the run whose sync it holds


@dataclass(frozen=True)
class Sources:
    """What a launch sends, scanned on this machine before any host is touched (transport.sync.scan:
    an unreadable file stops it there), and, once sent, the sha256 of the bytes each node
    received (`sent`: node -> destination path -> hash)."""

    code: Scan
    data: Scan | None
    sent: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)


def scan_sources(job: Job, console: Console) -> Sources:
    """The job's workdir and data as fleet sends them; what is skipped, and why, said once."""
    with console.waiting("reading the files to send"):
        code = scan(job.workdir, job.exclude, ignore_files=True, never=job.unsent)
        data = scan(job.data, (), never=job.unsent) if job.data else None
    kept = [rel for rel, why in code.ignored if why == ignore.NOTIFY]
    others = tuple((rel, why) for rel, why in code.ignored if why not in (ignore.NOTIFY,
                                                                          ignore.PULLED))
    for rel in [rel for rel, why in code.ignored if why == ignore.PULLED][:SKIPPED_SHOWN]:
        console.info(f"not sent: {code.root / rel}: results of `fleet pull` (it holds "
                     f"{ignore.PULLED}; delete that file to sync the folder)")
    if others:
        console.info(f"not sent: {ignore.summary(others)} (`fleet plan` names them)")
    for rel in kept[:SKIPPED_SHOWN]:
        console.info(f"not sent: {code.root / rel}: it holds a [notify] (its webhook stays on "
                     "this machine)")
    for rel, why in ignore.needed(code.ignored, (job.script or "", *job.setup_inputs)):
        raise ConfigError(job.path, "script" if rel == job.script else "setup_inputs",
                          f"{rel} holds a [notify], which is never synced (its webhook stays "
                          "on this machine): move the [notify] to another file"
                          if why == ignore.NOTIFY else
                          f"{rel} is left out of the sync by {job.workdir / why}; send it with "
                          f"a line `!{rel}` in {job.workdir / ignore.FLEETIGNORE}")
    for s in (code, data):
        if s is None:
            continue
        for rel, why in s.skipped[:SKIPPED_SHOWN]:
            console.info(f"not sent: {s.root / rel}: {why}")
        if len(s.skipped) > SKIPPED_SHOWN:
            console.info(f"not sent: {len(s.skipped) - SKIPPED_SHOWN} more file(s) under "
                         f"{s.root} (links outside it, special files)")
        for rel in s.sparse:
            console.info(f"note: {s.root / rel} is sparse: it is sent whole and arrives dense")
    return Sources(code, data)


SKIPPED_SHOWN = 10


@dataclass
class _Listed:
    """One node's upload after its listing: per synced directory (scan, where, what is there,
    label) and the files that changed."""

    node: NodePlan
    run_files: bool
    dirs: list[tuple[Scan, str, dict[str, tuple[int, int]], str]]
    rels: list[list[str]]
    t0: float
    streamed: dict[int, transfer.Moved] | None = None  # per directory, once streamed
    stale: list[str] = dataclasses.field(default_factory=list)  # see transport.prune

    @property
    def changed_bytes(self) -> int:
        return sum(d[0].manifest[r][0] for d, rels in zip(self.dirs, self.rels, strict=True)
                   for r in rels)

    @property
    def resumes(self) -> bool:
        """A partial file of an interrupted transfer is there for a changed file."""
        return any(part_name(r) in d[2] for d, rels in zip(self.dirs, self.rels, strict=True)
                   for r in rels)


def upload(session: Session, plan: Plan, console: Console,
           sources: Sources | None = None) -> Sources:
    """Sync the code and data (once per shared filesystem) and write the rendered scripts on
    every node: one listing each (which also creates the directories); large changes, or
    ones resuming an interrupted transfer (transport.transfer.streams), streamed to every node
    at once by transport.transfer (relayed node to node); the rest, with the run's files, in
    one verified bundle each. Raises HostError naming each node that failed
    (nothing has started yet).
    Returns the sources with what each node received."""
    sources = sources or scan_sources(plan.job, console)
    leader = {name: group[0] for group in plan.storage for name in group}
    nodes = {n.host.name: n for n in plan.nodes}
    what = "code and data" if sources.data is not None else "code"
    with console.hosts_waiting(f"sending the {what}", nodes) as wait:
        return _upload(session, plan, console, sources, leader, nodes, wait)


def _upload(session: Session, plan: Plan, console: Console, sources: Sources,
            leader: dict[str, str], nodes: dict[str, NodePlan], wait: Pending) -> Sources:
    _sync(session, plan, console, sources,
          [(n, leader[name] == name, True) for name, n in nodes.items()], wait)

    def confirm(node: NodePlan) -> bool:
        """A node that shares its leader's storage sees the leader's sync; if it does not (a
        copied workdir, say), it gets its own."""
        t = session.transports[node.host.name]
        wait.again(node.host.name, f"the look at {leader[node.host.name]}'s copy")
        seen = t.run(sh("cat", f"{node.code_dir}/{SYNCED}") + " 2>/dev/null",
                     what="read the sync marker").out.strip()
        if seen == plan.run_id:
            wait.finish(node.host.name)
            console.phase(node.host.name, f"code: shared with {leader[node.host.name]}")
            return True
        console.phase(node.host.name, "code: its storage is not shared after all; syncing")
        return False

    seen = all_ok("prepare", each(((n, nodes[n]) for n in nodes if leader[n] != n), confirm))
    unshared = [(nodes[n], True, False) for n, shared in seen.items() if not shared]
    if unshared:
        _sync(session, plan, console, sources, unshared, wait)
    return sources


def _sync(session: Session, plan: Plan, console: Console, sources: Sources,
          todo: list[tuple[NodePlan, bool, bool]], wait: Pending) -> None:
    """For each (node, syncs its directories, writes the run's files): list, stream what is
    large, bundle the rest; the caller's guard removes what was written on a failure."""
    code, data = sources.code, sources.data
    lock = threading.Lock()

    def listed(item: tuple[NodePlan, bool, bool]) -> _Listed:
        node, syncs, run_files = item
        t = session.transports[node.host.name]
        dirs = [(code, node.code_dir, code.manifest, "code")] if syncs else []
        if syncs and node.data_dir and data is not None:
            dirs.append((data, node.data_dir, data.manifest, "data"))
        private = (node.run_dir, f"{node.run_dir}/{SITE}") if run_files else ()
        wait.start(node.host.name, "its listing")
        t0 = time.monotonic()
        r = t.run(listing_script([d[1] for d in dirs], private, (node.code_dir,),
                                 tuple(prune.listing_lines(node.code_dir)) if syncs else ()),
                  what=f"create {node.run_dir}")
        r.check(node.host.name)
        faults.point("upload-listed")
        theres = parse_listing(r.out, len(dirs))
        dirs = [(src, dest, there, label) for (src, dest, _, label), there
                in zip(dirs, theres, strict=True)]
        rels = [changed(src.manifest, there) for src, _, there, _ in dirs]
        stale = prune.stale(prune.parse_was(r.out), code.manifest, theres[0]) if syncs else []
        return _Listed(node, run_files, dirs, rels, t0, stale=stale)

    lists = all_ok("prepare", each(((n.host.name, (n, s, r)) for n, s, r in todo), listed))
    big = [ls for ls in lists.values() if transfer.streams(ls.changed_bytes, ls.resumes)]
    if big:
        _stream(session, console, sources, big)

    def finish(ls: _Listed) -> None:
        node = ls.node
        t = session.transports[node.host.name]
        entries: list[Entry] = []
        if ls.streamed is None:
            for (src, dest, _, _), rels in zip(ls.dirs, ls.rels, strict=True):
                entries += code_entries(src, dest, rels)
        after: tuple[str, ...] = ()
        if ls.dirs:
            entries.append(Entry(f"{node.code_dir}/{SYNCED}", 0o644, data=plan.run_id.encode()))
            pruning, after = prune.entries(node.code_dir, code.manifest, ls.stale, ls.dirs[0][2])
            entries += pruning
        if ls.run_files:
            entries += [Entry(f"{node.run_dir}/{name}", mode, data=text.encode())
                        for name, (text, mode) in render_node(plan, node).files.items()]
        wait.start(node.host.name, "its files")
        if entries:
            got = send_bundle(t, entries, plan.run_id, after)
            with lock:
                sources.sent.setdefault(node.host.name, {}).update(got)
        took = time.monotonic() - ls.t0
        for k, ((src, _, _, label), rels) in enumerate(zip(ls.dirs, ls.rels, strict=True)):
            if ls.streamed is None:
                files, size, kept, touched = len(rels), sum(src.manifest[r][0] for r in rels), 0, 0
            else:
                m = ls.streamed.get(k, transfer.Moved())
                files, size, kept, touched = m.files, m.sent, m.kept, m.touched
            console.event(Transfer(node.host.name, label, files, size,
                                   len(src.manifest) - files, took))
            with lock:
                sent.setdefault(label, {})[node.host.name] = size
            if kept:
                console.phase(node.host.name, f"{label}: {transfer.human(kept)} of the files "
                              "sent were there already (a partial or older copy): verified "
                              "and kept, not sent again")
            if touched:
                console.phase(node.host.name, f"{label}: {touched} file(s) with a new time "
                              "but the same content: only their times were set")
        if ls.stale:
            console.phase(node.host.name, f"code: removed {len(ls.stale)} file(s) an earlier "
                          "sync left that are no longer synced (deleted or ignored here)")
        wait.finish(node.host.name)

    sent: dict[str, dict[str, int]] = {}
    all_ok("prepare", each(lists.items(), finish))
    for label, sizes in sent.items():
        if (words := sizes_sent_to(label, sizes)) is not None:
            console.info(words)


def _stream(session: Session, console: Console, sources: Sources, big: list[_Listed]) -> None:
    """The changes of these nodes, streamed to all of them at once (fleet.transport.transfer)."""
    count = max(len(ls.dirs) for ls in big)
    scans = [next(ls.dirs[k][0] for ls in big if len(ls.dirs) > k) for k in range(count)]
    targets, dirs = [], [transfer.Dir(scans[k], {}, {}, {}) for k in range(count)]
    for ls in big:
        t = session.transports[ls.node.host.name]
        name = ls.node.host.name
        for k, (_, dest, there, _) in enumerate(ls.dirs):
            dirs[k].roots[name] = t.path(dest)
            dirs[k].there[name] = there
            dirs[k].rels[name] = ls.rels[k]
        targets.append(transfer.Target(
            name, t, ls.node.host.python, ls.node.net.address or ls.node.host.address,
            tuple(t.path(d[1]) for d in ls.dirs) + ("",) * (count - len(ls.dirs))))
    outcome, _ = transfer.move(targets, dirs, console)
    for ls in big:
        name = ls.node.host.name
        ls.streamed = outcome.moved.get(name, {})
        got = {f"{ls.dirs[k][1]}/{rel}": sha
               for (k, rel), sha in outcome.placed.get(name, {}).items() if k < len(ls.dirs)}
        sources.sent.setdefault(name, {}).update(got)


def upload_checked(session: Session, plan: Plan, console: Console, checks: bool,
                   sources: Sources | None = None) -> Sources:
    """upload(), with the preflight's port checks (`checks`) beside it: they touch only the
    master's port and test listeners, and each costs a few round trips that would otherwise
    come first. Either one's error is raised, the upload's first."""
    if not checks:
        return upload(session, plan, console, sources)
    problem: list[BaseException] = []
    listeners = Listeners()

    def check() -> None:
        try:
            preflight(session, plan, console, listeners)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            problem.append(e)
            listeners.stop_all()  # a check that failed half-way leaves no listener behind

    th = threading.Thread(target=check, daemon=True)
    th.start()
    try:
        sent = upload(session, plan, console, sources)
    except BaseException:
        # Nothing may outlive a failed launch on a node: no new test listener starts, a
        # round trip under way may finish, and every listener started ends now instead of
        # waiting 20 s for connections that will never come.
        listeners.cancelled.set()
        try:
            th.join(CHECKS_GIVE_UP_S)
        finally:
            listeners.stop_all()
        raise
    # Checks that outlast the upload: their spinner is this thread's, so that it surely ends
    # (the checks' own thread may be left behind).
    if th.is_alive():
        m = plan.master
        with console.waiting(f"preflight: rendezvous port {m.master_port} on {m.host.name}"):
            th.join()
    if problem:
        raise problem[0]
    return sent


CHECKS_GIVE_UP_S = 5.0  # how long a failed upload waits for a port check's round trip under way
