"""The queue's runner: one per user and queue host, started by `fleet submit` / `fleet sweep`
and alive for as long as something is queued or running. It reads the runs the laptop queued
(jobs/<run>.json), hears each host's agent (fleet/nodeside/queue_agent.py) over signed TCP
links, tells them what to start where (fleet/nodeside/shared/queue_rules.py: place) and writes
what it knows in state.json. Its one secret is the queue's key; it starts nothing itself.

argv: QUEUE_DIR ADDR (the address the other hosts reach this one by)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import sys
import time
from typing import Any

from fleet.nodeside.shared.queue_files import names, run_ok, write_json
from fleet.nodeside.shared.queue_link import QueueLink
from fleet.nodeside.shared.queue_plan import overrun, packed, views_of
from fleet.nodeside.shared.queue_rules import (
    ENDED,
    FAILED,
    FROM_AGENT,
    HOST,
    LOST,
    Q_STOPPED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    BadWord,
    Slots,
    Spec,
    exit_code,
    gpu_list,
    held_gpus,
    metric_values,
    order,
    parse_spec,
    place,
    run_id,
    running_runs,
    waiting_why,
    when,
    words,
)
from fleet.nodeside.shared.watch_link import listen

IDLE_S = 15.0  # nothing queued or running this long: the runner ends
LOST_S = 30.0  # an agent silent this long is lost, and the runs it ran with it
START_S = 90.0  # a run an agent was told to start and never confirmed goes back in the queue
HELLO_S = 10.0  # a link that has not said hello by then is dropped
MOST_LINKS = 512
TICK_S = 0.5  # how often the queue's directory is read again
KEEP_S = 30 * 86400  # an ended run stays in state.json this long


class Runner:
    def __init__(self, qdir: str, token: bytes) -> None:
        self.qdir, self.token = qdir, token
        self.specs: dict[str, Spec] = {}
        self.runs: dict[str, dict[str, Any]] = {}
        self.links: list[QueueLink] = []
        self.agents: dict[str, dict[str, Any]] = {}  # host -> link, slots, seen
        self.cancelled: set[str] = set()
        self.hosts: list[str] = []  # the inventory's order, from the specs
        self.busy_since = self.born = time.time()
        self.changed = True
        try:
            with open(os.path.join(qdir, "state.json"), encoding="utf-8") as f:
                runs = json.load(f).get("runs", {})
            self.runs = {k: v for k, v in runs.items() if isinstance(v, dict)}
        except (OSError, ValueError, AttributeError):
            pass

    # ---- the queue's directory ------------------------------------------------------------
    def scan(self) -> None:
        for name in names(os.path.join(self.qdir, "jobs")):
            run = name[:-5]
            if not name.endswith(".json") or run in self.specs:
                continue
            try:
                with open(os.path.join(self.qdir, "jobs", name), encoding="utf-8") as f:
                    spec = parse_spec(f.read(65536))
            except (OSError, ValueError):
                continue
            if spec.run != run:
                continue
            self.specs[run] = spec
            self.hosts += [h for h in spec.hosts if h not in self.hosts]
            if run not in self.runs:
                self.runs[run] = {"sweep": spec.sweep, "state": QUEUED, "host": "", "gpus": [],
                                  "attempt": 1, "started": None, "ended": None, "code": None,
                                  "metrics": {}, "why": "", "lost": []}
                self.changed = True
        for name in names(os.path.join(self.qdir, "cancel")):
            if name not in self.cancelled and run_ok(name):
                self.cancelled.add(name)
                self.cancel(name)

    def cancel(self, name: str) -> None:
        """Stop a sweep (or one run): what waits never starts, what runs is told to stop."""
        for run, r in self.runs.items():
            if name not in (run, r.get("sweep")) or r["state"] in ENDED:
                continue
            if r["state"] == QUEUED:
                self.end(run, Q_STOPPED, "stopped before it started")
            elif r["host"] in self.agents:
                self.agents[r["host"]]["link"].send("stop", run=run, why="fleet sweep stop")
        self.changed = True

    def end(self, run: str, state: str, why: str, **facts: Any) -> None:
        """The run's end, for good: its spec goes (no later runner queues it again)."""
        r = self.runs[run]
        r.update(state=state, why=why, ended=facts.pop("ended", None) or time.time(),
                 closed=time.time(), **facts)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.qdir, "jobs", f"{run}.json"))
        self.changed = True

    # ---- the agents -----------------------------------------------------------------------
    def heard(self, link: QueueLink, kind: str, f: dict[str, Any]) -> None:
        now = time.time()
        if kind == "hello":
            host = f["host"]
            if not isinstance(host, str) or not HOST.match(host):
                raise BadWord("not a host")
            gpus = gpu_list(f["gpus"])
            old = self.agents.get(host)
            if old is not None and old["link"] is not link:
                old["link"].close()
                with contextlib.suppress(ValueError):
                    self.links.remove(old["link"])
            link.host = host
            self.agents[host] = {"link": link, "slots": Slots(gpus, set()), "seen": now}
        if not link.host:
            raise BadWord("no hello")
        agent = self.agents[link.host]
        agent["seen"] = now
        slots: Slots = agent["slots"]
        if kind in ("hello", "beat"):
            slots.gpus = gpu_list(f["gpus"])
            smi = f["smi"]
            if smi not in ("ok", "none", "failed"):
                raise BadWord("not nvidia-smi's word")
            slots.free = set(gpu_list(f["free"], slots.gpus)) if smi != "failed" else set()
            slots.held = held_gpus(f["held"], slots.gpus)
            running = running_runs(f["running"], slots.gpus)
            # where nvidia-smi did not answer nothing goes: what fleet cannot see is not free
            slots.whole = smi == "failed" or any(
                self.specs.get(r) is not None and self.specs[r].gpus == 0 for r in running)
            self.reconcile(link, running, now)
        elif kind in ("started", "refused", "ended"):
            run = run_id(f["run"])
            r = self.runs.get(run)
            if r is None or r["host"] != link.host or r["state"] != RUNNING:
                if kind == "ended":  # an older word (a run since lost, or ended): forgotten
                    link.send("ack", run=run)
                return  # not what this runner told that host to run
            if kind == "started":
                r["started"] = when(f["at"])
                r["gpus"] = list(gpu_list(f["gpus"], slots.gpus))
                r["why"] = ""
            elif kind == "refused" and self.stopped(run):
                self.end(run, Q_STOPPED, "stopped before it started")
            elif kind == "refused":
                r.update(state=QUEUED, host="", gpus=[], why=words(f["why"]))
            else:
                code = exit_code(f["code"])
                stopped = self.stopped(run) or f["stopped"] is True  # its stop.sh ran: fleet stop
                state = Q_STOPPED if stopped else SUCCEEDED if code == 0 else FAILED
                self.end(run, state, "" if state == SUCCEEDED else (
                    f"exit code {code}" if code is not None else "ended without an exit code"),
                    code=code, started=when(f["started"]), ended=when(f["ended"]),
                    metrics=metric_values(f["metrics"]))
                link.send("ack", run=run)
            self.changed = True

    def reconcile(self, link: QueueLink, running: dict[str, tuple[int, ...]], now: float) -> None:
        """What an agent runs, against what this runner thinks: a run taken for lost is its
        again; one never started is queued again; one it no longer knows is gone (drop)."""
        host = link.host
        for run, gpus in running.items():
            r = self.runs.get(run)
            if r is not None and r["state"] != RUNNING and host in r.get("lost", []):
                r.update(state=RUNNING, host=host, gpus=list(gpus), why="",
                         attempt=max(1, r["attempt"] - (r["state"] == QUEUED)),
                         lost=[h for h in r["lost"] if h != host])
                self.changed = True
        for run, r in self.runs.items():
            if r["host"] != host or r["state"] != RUNNING:
                continue
            if run in running:
                r.pop("missing", None)
                if self.stopped(run) and now - r.get("stop_sent", 0) > 5:  # told again
                    r["stop_sent"] = now
                    link.send("stop", run=run, why="fleet sweep stop")
            elif r["started"] is None and now - r.get("sent", now) > START_S:
                r.update(state=QUEUED, host="", gpus=[], why=f"{host} never started it")
                self.changed = True
            elif r["started"] is not None and r.setdefault("missing", 0) >= 2:  # 3 in a row
                self.drop(run, f"{host}'s agent no longer knows it")
            elif r["started"] is not None:
                r["missing"] += 1

    def stopped(self, run: str) -> bool:
        return bool({run, self.runs[run].get("sweep")} & self.cancelled)

    def lose(self, now: float) -> None:
        """Agents silent for LOST_S are gone, and with them the runs they ran; so are runs on
        a host whose agent never came back to this runner; links that never said hello go."""
        for link in [k for k in self.links if not k.host and now - k.opened > HELLO_S]:
            link.close()
            self.links.remove(link)
        for host, agent in list(self.agents.items()):
            if now - agent["seen"] >= LOST_S:
                agent["link"].close()
                del self.agents[host]
        if now - self.born < LOST_S:
            return
        for run, r in self.runs.items():
            if r["state"] == RUNNING and r["host"] not in self.agents:
                self.drop(run, f"{r['host']} was lost (its agent silent {LOST_S:.0f} s)")

    def drop(self, run: str, why: str) -> None:
        """A run that was running and is gone with its host: started again where its job
        allows another attempt, else lost."""
        r, spec = self.runs[run], self.specs.get(run)
        r["lost"] = [*r.get("lost", []), r["host"]]
        if spec is not None and r["attempt"] < spec.attempts and not self.stopped(run):
            r.update(state=QUEUED, host="", gpus=[], started=None, attempt=r["attempt"] + 1,
                     why=f"attempt {r['attempt'] + 1}: {why}")
        else:
            self.end(run, LOST, why)
        self.changed = True

    def schedule(self) -> None:
        waiting = [self.specs[r] for r, v in self.runs.items()
                   if v["state"] == QUEUED and r in self.specs and not self.stopped(r)]
        if not waiting:
            return
        extra = overrun(self.runs, self.specs)
        views = views_of({h: a["slots"] for h, a in self.agents.items()}, self.runs, self.specs,
                         time.time(), extra)
        plan = packed(waiting, views, self.hosts, extra)
        for spec, host, gpus in place(waiting, views, self.hosts) if plan is None else plan:
            self.runs[spec.run].update(state=RUNNING, host=host, gpus=list(gpus), why="starting",
                                       sent=time.time())
            self.agents[host]["link"].send("start", run=spec.run, gpus=list(gpus))
            self.changed = True
        ahead = 0
        for spec in order(waiting):
            r = self.runs[spec.run]
            if r["state"] == QUEUED:
                why = waiting_why(spec, views) + (f"; behind {ahead} queued run(s)" if ahead
                                                  else "")
                ahead += 1
                lead = r["why"].split(": ", 1)[0] + ": " if r["why"].startswith("attempt") else ""
                if r["why"] != lead + why:
                    r["why"] = lead + why
                    self.changed = True

    def write(self, port: int) -> None:
        now = time.time()
        self.runs = {k: v for k, v in self.runs.items()
                     if v["state"] not in ENDED or (v.get("closed") or now) > now - KEEP_S}
        agents = {h: {"seen": a["seen"], "gpus": list(a["slots"].gpus),
                      "free": sorted(a["slots"].free),
                      "held": {str(g): w for g, w in a["slots"].held.items()}}
                  for h, a in self.agents.items()}
        if write_json(os.path.join(self.qdir, "state.json"), {
                "v": 1, "pid": os.getpid(), "port": port, "now": now, "agents": agents,
                "runs": self.runs}):
            self.changed = False  # else (a full disk) written again at the next change

    def active(self) -> bool:
        return any(r["state"] in (QUEUED, RUNNING) for r in self.runs.values())


def main() -> None:
    qdir, addr = sys.argv[1], sys.argv[2]
    with open(os.path.join(qdir, "key"), encoding="ascii") as f:
        token = f.read().strip().encode()
    server = listen(addr, 0)
    server.listen(64)
    server.setblocking(False)
    port = server.getsockname()[1]
    runner = Runner(qdir, token)
    write_json(os.path.join(qdir, "runner.json"), {"pid": os.getpid(), "port": port,
                                              "addr": addr, "started": time.time()})
    last_scan = 0.0
    while True:
        socks = [server] + [link.sock for link in runner.links]
        ready, _, _ = select.select(socks, [], [], TICK_S)
        for sock in ready:
            if sock is server:
                with contextlib.suppress(OSError):
                    conn, _ = server.accept()
                    if len(runner.links) >= MOST_LINKS:
                        conn.close()
                        continue
                    link = QueueLink(conn, token, FROM_AGENT)
                    link.opened = time.time()
                    runner.links.append(link)
                continue
            link = next(k for k in runner.links if k.sock is sock)
            try:
                for kind, fields in link.receive():
                    runner.heard(link, kind, fields)
            except (OSError, BadWord, KeyError):
                link.close()
                runner.links.remove(link)
        now = time.time()
        if now - last_scan >= TICK_S:
            last_scan = now
            runner.scan()
            runner.lose(now)
        runner.schedule()
        if runner.changed:
            runner.write(port)
        if runner.active():
            runner.busy_since = now
        elif now - runner.busy_since > IDLE_S and done(runner, qdir, port):
            return


def done(runner: Runner, qdir: str, port: int) -> bool:
    """Whether the runner ends now: under the queue's lock (a submit holds it while it adds
    runs and looks for a live runner), nothing new came; then its agents are told."""
    fd = os.open(os.path.join(qdir, "lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        runner.scan()
        if runner.active():
            return False
        for link in runner.links:
            link.send("bye")
        runner.write(port)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(qdir, "runner.json"))
        return True
    finally:
        os.close(fd)


if __name__ == "__main__":
    main()
