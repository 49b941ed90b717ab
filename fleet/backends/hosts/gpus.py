"""Shared GPUs on hosts: every host's GPUs and leases asked at once (`fleet gpus`, its --watch
over connections kept open), leases taken and given back (`fleet reserve`, `fleet release`), and
the gate `fleet up` passes before it claims any host: other users' leases and processes refuse
it, `--wait` polls until nothing stands in the way."""

from __future__ import annotations

import getpass
import math
import os
import socket
import time
from collections.abc import Callable

from fleet import waits
from fleet.config.inventory import Host
from fleet.console import Console, Meaning
from fleet.errors import GpusTaken, Interrupted
from fleet.facts.gpus import GpuFacts, gpu_facts
from fleet.facts.leases import LEASE_DIR, LeaseOrder, Taken, parse_answer
from fleet.gpuview import Blocker, blockers, lease_blockers, process_blockers, span
from fleet.nodeside import python_program
from fleet.shell import home_word
from fleet.transport import Transport, open_transport
from fleet.transport.group import all_ok, each, reason
from fleet.waits import Pending, named

POLL_S = 5.0  # up --wait: one nvidia-smi and one directory listing per host this often


class Survey:
    """Connections to hosts, kept open between looks (`fleet gpus --watch`); a host that could
    not be reached is tried again at the next look."""

    def __init__(self, hosts: list[Host]) -> None:
        self.hosts = hosts
        self.transports: dict[str, Transport] = {}

    def look(self) -> dict[str, GpuFacts | str]:
        """Per host, in the inventory's order, its GPUs and leases or why they are unknown (the
        wait announced with fleet.waits.over, naming the slow hosts)."""
        def one(h: Host, wait: Pending) -> GpuFacts:
            t = self.transports.get(h.name)
            if t is None:
                wait.start(h.name, "its connection")
                t = self.transports[h.name] = open_transport(h)
            wait.start(h.name, "nvidia-smi and its leases")
            try:
                return gpu_facts(t)
            except Exception:
                self.transports.pop(h.name, None)
                t.close()
                raise

        with waits.over("the GPUs", (h.name for h in self.hosts)) as wait:
            results = each(named((h.name, h) for h in self.hosts),
                           wait.tracked(lambda h: one(h, wait)))
        return {h.name: r if isinstance(r := results[h.name], GpuFacts) else reason(r)
                for h in self.hosts}

    def close(self) -> None:
        each(self.transports.items(), lambda t: t.close())
        self.transports.clear()


def origin() -> str:
    """Where a lease was taken from, as its record says (for a person reading it)."""
    try:
        who = getpass.getuser()
    except (KeyError, OSError):  # no USER and no passwd entry (a container)
        who = str(os.getuid())
    return f"{who}@{socket.gethostname()}"


def lease(host: Host, order: LeaseOrder) -> Taken:
    """Carry out a lease order on one host (fleet/nodeside/lease.py); the wait announced
    with fleet.waits.over names the host and what it is on."""
    with waits.over("the lease", [host.name]) as wait:
        wait.start(host.name, "its connection")
        t = open_transport(host)
        try:
            wait.start(host.name, "its lease file")
            return lease_on(t, host, order)
        finally:
            t.close()


def lease_on(t: Transport, host: Host, order: LeaseOrder) -> Taken:
    """A lease order carried out over a connection open to `host`."""
    script = python_program(home_word(host.python), "lease.py", LEASE_DIR,
                            *order.argv(origin()), flags=("-I", "-S"))
    r = t.run(script, timeout=30, what="lease.py (GPU leases)")
    said = parse_answer(r.out)
    if not said.ok and not said.conflicts and r.code and said.error.endswith("no answer"):
        return Taken(ok=False, error=f"{host.python} exited with {r.code}: "
                                      f"{(r.err or r.out).strip()[-300:]}")
    return said


def hosts_state(transports: dict[str, Transport]) -> dict[str, GpuFacts]:
    return all_ok("listing GPUs and leases", each(transports.items(), gpu_facts))


def gate(transports: dict[str, Transport], hosts: list[Host], wait: float | None,
         ignore_leases: bool, console: Console, force: bool = False) -> dict[str, GpuFacts]:
    """Before `fleet up` claims anything: other users' leases (unless `ignore_leases`) and
    other users' processes (unless `force`) on what the job would use refuse it, each let
    through said once; with `wait` (seconds, math.inf for no end) it waits instead until those
    leases and anyone's processes on those GPUs are gone. What was last learnt per host."""
    facts = hosts_state(transports)
    if ignore_leases:
        for b in _blocking(hosts, facts, lease_blockers):
            console.info(f"--ignore-leases: starting although {b.line()}", Meaning.WARN)
    if wait is None:
        what, why = refused(hosts, facts, time.time(), ignore_leases, force)
        if why:
            raise GpusTaken(what, why)
        if force:
            for b in _blocking(hosts, facts, process_blockers):
                console.info(f"--force: starting although {b.line()}", Meaning.WARN)
        return facts

    def check(host: str, chosen: tuple[int, ...] | None, f: GpuFacts,
              now: float) -> list[Blocker]:
        return blockers(host, chosen, f, now, leases=not ignore_leases)

    found = _blocking(hosts, facts, check)
    if not found:
        return facts
    limit = "" if math.isinf(wait) else f" (at most {span(wait)})"
    console.info(f"waiting until every GPU this job uses is free{limit}:")
    shown: set[tuple[str, int | None, str]] = set()
    deadline = time.monotonic() + wait
    try:
        with console.waiting("waiting for GPUs") as w:
            while found:
                now = {(b.host, b.gpu, b.what) for b in found}
                if now != shown:  # said again only when what is in the way changed
                    for b in found:
                        console.info(f"  {b.line()}", Meaning.WARN)
                    shown = now
                w.update(f"waiting for GPUs: {len(found)} in the way ({found[0].line()})")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise GpusTaken(f"waiting {span(wait)} for free GPUs", _by_host(
                        found, "still in the way when the wait ended"))
                time.sleep(min(POLL_S, left))
                found = _poll(transports, hosts, check)
    except Interrupted as e:
        raise Interrupted(e.signame, "stopped waiting for free GPUs; still in the way: " +
                          "; ".join(b.line() for b in found)) from None
    console.info("every GPU this job uses is free: starting", Meaning.OK)
    return hosts_state(transports)  # what the plan warns of is what is there now


def _poll(transports: dict[str, Transport], hosts: list[Host],
          check: Callable[[str, tuple[int, ...] | None, GpuFacts, float], list[Blocker]],
          ) -> list[Blocker]:
    """One look while waiting: a host that did not answer this time is in the way, named, and
    asked again at the next look (a blip must not end a wait of hours)."""
    results = each(transports.items(), gpu_facts)
    now = time.time()
    out: list[Blocker] = []
    for h in hosts:
        r = results[h.name]
        out += check(h.name, h.gpus, r, now) if isinstance(r, GpuFacts) else [
            Blocker(h.name, None, f"not asked this time: {reason(r)}", "unasked")]
    return out


def _blocking(hosts: list[Host], facts: dict[str, GpuFacts],
              check: Callable[[str, tuple[int, ...] | None, GpuFacts, float], list[Blocker]],
              ) -> list[Blocker]:
    now = time.time()
    return [b for h in hosts for b in check(h.name, h.gpus, facts[h.name], now)]


def refused(hosts: list[Host], facts: dict[str, GpuFacts], now: float, ignore_leases: bool,
            force: bool) -> tuple[str, dict[str, str]]:
    """Plain `fleet up`'s decision (pure): per host in the way, what is there and its fix, and
    what was being checked; an empty dict lets it start."""
    def found(check: Callable[[str, tuple[int, ...] | None, GpuFacts, float], list[Blocker]],
              advice: str) -> dict[str, str]:
        return _by_host([b for h in hosts for b in check(h.name, h.gpus, facts[h.name], now)],
                        advice)

    leases = {} if ignore_leases else found(
        lease_blockers, "wait for it (fleet up --wait) or start anyway (--ignore-leases)")
    procs = {} if force else found(
        process_blockers, "wait for it (fleet up --wait) or start anyway (--force)")
    why = {h.name: "; ".join(x for x in (leases.get(h.name), procs.get(h.name)) if x)
           for h in hosts if h.name in leases or h.name in procs}
    return ("checking GPU leases" if not procs else "checking who uses the GPUs"), why


def _by_host(found: list[Blocker], advice: str) -> dict[str, str]:
    out: dict[str, list[str]] = {}
    for b in found:
        where = f"GPU{b.gpu}: " if b.gpu is not None else b.where()
        out.setdefault(b.host, []).append(f"{where}{b.text}")
    return {host: "; ".join(texts) + f" ({advice})" for host, texts in out.items()}
