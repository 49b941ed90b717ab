"""`fleet doctor` on a host list: connect to every host (its clock against this machine's comes
with the connection's hello), learn the address fleet would use for it (the probe, as for a
launch), measure each host (CPUs, memory, disk, GPUs), then the links between them in rounds
of disjoint pairs (fleet.doctor.pairs), both ways at once, from node to node. Pairs found slow
are measured once more, and the better figure kept: one noisy moment names nothing. Every sink
is ended by its PID before this returns, whatever happened; each measuring program is bounded
in time on the node as well."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from fleet.config.doctor import Bounds
from fleet.config.inventory import Host, Inventory
from fleet.doctor import pairs as pairing
from fleet.doctor.figures import Examination, Link, Ring
from fleet.doctor.verdict import disk_suspects, suspects
from fleet.facts.gpuhealth import GPU_HEALTH_SCRIPT, GpuHealthFacts, parse_gpu_health
from fleet.facts.hostfigs import HostFigures, host_script, parse_host
from fleet.facts.links import (
    SINK_MARK,
    Sent,
    allreduce_script,
    free_port_script,
    parse_allreduce,
    parse_free_port,
    parse_send,
    parse_sink,
    send_script,
    sink_script,
)
from fleet.facts.probe import PythonState, master_address, net_for, probe
from fleet.shell import sh
from fleet.transport import Transport, open_transport
from fleet.transport.group import each, reason
from fleet.waits import Words

# (bulk seconds per link test, disk test bytes, CPU interval seconds): quick, and the full form
QUICK = (1.0, 16 << 20, 0.5)
FULL = (3.0, 256 << 20, 2.0)


def _quiet(_: Words) -> None:
    """No one watches."""


class Sinks:
    """The sinks started on the nodes, ended together by PID (each only while its command line
    still carries fleet's mark: one that ended by itself leaves its PID to anything)."""

    def __init__(self) -> None:
        self.started: dict[str, tuple[Transport, int, int]] = {}  # host -> (t, port, pid)

    def start(self, ts: dict[str, Transport], seconds: int,
              expect: dict[str, int]) -> dict[str, str]:
        """A sink on every host; per host that has none, why."""
        def one(t: Transport) -> tuple[int, int] | str:
            r = t.run(sink_script(t.host.python, seconds, expect[t.host.name]), timeout=30,
                      what="start the link test's sink")
            return parse_sink(r.out)

        got = each(ts.items(), one)
        failed: dict[str, str] = {}
        for name, r in got.items():
            if isinstance(r, tuple):
                self.started[name] = (ts[name], *r)
            else:
                failed[name] = r if isinstance(r, str) else reason(r)
        return failed

    def stop(self) -> None:
        started, self.started = self.started, {}

        def end(item: tuple[Transport, int, int]) -> None:
            t, _, pid = item
            proc = f"/proc/{pid}/cmdline"
            t.run(sh("grep", "-qzxF", SINK_MARK, proc) + " 2>/dev/null && " + sh("kill", pid)
                  + " 2>/dev/null; true", timeout=15, what="end the link test's sink")

        each(started.items(), end)


def examine(inventory: Inventory, quick: bool, bounds: Bounds,
            progress: Callable[[Words], None] = _quiet) -> Examination:
    """Every figure of every host of `inventory` (its spares too), and of the links between
    them; a host that cannot be reached or asked is in Examination.unreached."""
    hosts = list(inventory.every_host)
    bulk, size, interval = QUICK if quick else FULL
    ts: dict[str, Transport] = {}
    unreached: dict[str, str] = {}
    sinks = Sinks()
    try:
        progress(f"connecting to {len(hosts)} hosts")
        for name, r in each(((h.name, h) for h in hosts), open_transport).items():
            if isinstance(r, Exception):
                unreached[name] = reason(r)
            else:
                ts[name] = r
        nets: dict[str, tuple[str | None, bool]] = {}
        addrs = _addresses(inventory, hosts, ts, unreached, progress, nets)
        progress(f"measuring {len(ts)} hosts (CPU, memory, disk, GPUs)")
        figures, gpus = _measure(ts, size, interval, unreached)
        for name in disk_suspects(figures, bounds):  # one at a time: alone on a shared disk
            progress(f"measuring {name}'s disk again, alone")
            figures[name] = _again(ts[name], figures[name], size)
        ready = {n: t for n, t in ts.items() if n in figures and n in addrs}
        links, count = _links(ready, addrs, bulk, bounds, sinks, unreached, progress)
        sinks.stop()
        ring = None if quick else _ring(ready, addrs, nets, progress)
        offsets = {n: t.clock_offset for n, t in ts.items() if n in figures}
        return Examination(hosts={h.name: figures[h.name] for h in hosts if h.name in figures},
                           gpus=gpus, offsets=offsets, links=tuple(links), unreached=unreached,
                           rounds=count, quick=quick,
                           workdir={n: t.host.workdir for n, t in ts.items()}, bounds=bounds,
                           ring=ring)
    finally:
        sinks.stop()
        each(ts.items(), lambda t: t.close())


def _addresses(inventory: Inventory, hosts: list[Host], ts: dict[str, Transport],
               unreached: dict[str, str], progress: Callable[[Words], None],
               nets: dict[str, tuple[str | None, bool]] | None = None) -> dict[str, str]:
    """Per host the address torch would use for it (its own on the interface towards the
    master, as a launch plans it), from the probe; in `nets`, its interface and whether its
    python has torch."""
    reached = [h for h in hosts if h.name in ts]
    if not reached:
        return {}
    progress("probing the hosts' addresses")
    first = reached[0]
    ip = master_address(dataclasses.replace(inventory, hosts=(first,)), probe(ts[first.name]))

    def one(h: Host) -> str:
        facts = probe(ts[h.name], ip)
        net = net_for(h, facts, ip)
        if nets is not None:
            nets[h.name] = (net.interface, facts.python is PythonState.OK)
        return net.address or h.address

    out: dict[str, str] = {}
    for name, r in each(((h.name, h) for h in reached), one).items():
        if isinstance(r, Exception):
            unreached[name] = f"probe: {reason(r)}"
        else:
            out[name] = r
    return out


def _measure(ts: dict[str, Transport], size: int, interval: float, unreached: dict[str, str]
             ) -> tuple[dict[str, HostFigures], dict[str, GpuHealthFacts]]:
    def one(t: Transport) -> tuple[HostFigures, GpuHealthFacts]:
        r = t.run(host_script(t.host.python, t.host.workdir, size, interval), timeout=180,
                  what="measure the host")
        g = t.run(GPU_HEALTH_SCRIPT, timeout=30, what="nvidia-smi's health counters")
        return parse_host(r.out), parse_gpu_health(g.out)

    figures: dict[str, HostFigures] = {}
    gpus: dict[str, GpuHealthFacts] = {}
    for name, r in each(ts.items(), one).items():
        if isinstance(r, Exception):
            unreached[name] = reason(r)
        else:
            figures[name], gpus[name] = r
    return figures, gpus


def _again(t: Transport, first: HostFigures, size: int) -> HostFigures:
    """A host's disk measured a second time: the better of the two figures kept."""
    try:
        r = t.run(host_script(t.host.python, t.host.workdir, size, 0.1), timeout=180,
                  what="measure the disk again")
    except Exception:  # noqa: BLE001 - the first figure stands
        return first
    second = parse_host(r.out)

    def best(a: float | None, b: float | None) -> float | None:
        return max(a, b) if a is not None and b is not None else a if a is not None else b

    return dataclasses.replace(first, disk_write=best(first.disk_write, second.disk_write),
                               disk_read=best(first.disk_read, second.disk_read))


def _ring(ts: dict[str, Transport], addrs: dict[str, str],
          nets: dict[str, tuple[str | None, bool]], progress: Callable[[Words], None]
          ) -> Ring | None:
    """A ring all-reduce over every host at once (one process each), where every python has
    torch; its bus bandwidth as rank 0 says it, or why none came."""
    names = list(ts)
    if len(names) < 2:
        return None
    lacking = [n for n in names if not nets.get(n, (None, False))[1]]
    if lacking:
        return Ring(error=f"no torch for the python of {', '.join(lacking)}")
    progress(f"a ring all-reduce over {len(names)} hosts")
    first = ts[names[0]]
    port = parse_free_port(first.run(free_port_script(first.host.python), timeout=30,
                                     what="a free port for the all-reduce").out)
    if port is None:
        return Ring(error=f"no free port on {names[0]}")

    def one(rank: int) -> str:
        t = ts[names[rank]]
        return t.run(allreduce_script(t.host.python, addrs[names[0]], port, rank, len(names),
                                      nets[names[rank]][0]), timeout=150,
                     what="the all-reduce").out

    got = each(((str(k), k) for k in range(len(names))), one)
    said = got["0"]
    if isinstance(said, Exception):
        return Ring(error=f"{names[0]}: {reason(said)}")
    answer = parse_allreduce(said)
    if isinstance(answer, str):
        others = [f"{names[int(k)]}: {parse_allreduce(v)}" for k, v in got.items()
                  if k != "0" and isinstance(v, str) and "fail" in v]
        return Ring(error="; ".join([answer, *others])[:500])
    return Ring(answer[0], answer[1], len(names))


def _links(ts: dict[str, Transport], addrs: dict[str, str], bulk: float, bounds: Bounds,
           sinks: Sinks, unreached: dict[str, str], progress: Callable[[Words], None]
           ) -> tuple[list[Link], int]:
    names = list(ts)
    plan = [[(names[a], names[b]) for a, b in r] for r in pairing.rounds(len(names))]
    if not plan:
        return [], 0
    per_round = int(bulk) + 20
    expect = {n: 2 * sum(n in p for r in plan for p in r) for n in names}  # and a second look
    failed = sinks.start(ts, per_round * 3 * len(plan) + 30, expect)
    unreached.update({n: f"link test sink: {why}" for n, why in failed.items()})
    results: dict[tuple[str, str], Link] = {}
    for k, r in enumerate(plan, 1):
        progress(f"measuring links: round {k} of {len(plan)} ({len(r)} pairs at once)")
        results.update(_round(r, sinks, addrs, bulk))
    again = pairing.disjoint(suspects(list(results.values()), bounds))
    for k, r in enumerate(again, 1):
        progress(f"measuring the slow links again: {k} of {len(again)}")
        for key, link in _round(r, sinks, addrs, bulk).items():
            results[key] = results[key].better(link)
    return list(results.values()), len(plan) + len(again)


def _round(pairs: list[tuple[str, str]], sinks: Sinks, addrs: dict[str, str],
           bulk: float) -> dict[tuple[str, str], Link]:
    """Both directions of every pair at once."""
    def send(job: tuple[str, str]) -> Sent:
        src, dst = job
        if src not in sinks.started or dst not in sinks.started:
            return Sent(error=f"no sink on {dst if src in sinks.started else src}")
        t = sinks.started[src][0]
        port = sinks.started[dst][1]
        r = t.run(send_script(t.host.python, addrs[dst], port, addrs[src], bulk),
                  timeout=bulk + 60, what=f"the link test to {dst}")
        return parse_send(r.out)

    jobs = [(f"{a}>{b}", (a, b)) for a, b in pairs] + [(f"{b}>{a}", (b, a)) for a, b in pairs]
    got = each(jobs, send)

    def sent(key: str) -> Sent:
        r = got[key]
        return r if isinstance(r, Sent) else Sent(error=reason(r))

    return {(a, b): Link(a, b, sent(f"{a}>{b}"), sent(f"{b}>{a}")) for a, b in pairs}
