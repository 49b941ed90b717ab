"""The hosts backend's queue: a runner on the inventory's first host (its `<workdir>/queue`)
places the queued runs; an agent on every host starts them there (fleet/nodeside/queue_runner.py
and queue_agent.py). The laptop stages each run on every host, queues them all at once under
the queue's lock, makes sure the runner and the agents run, and then may go: they need nothing
of it. Its looks are the runner's state.json, read and checked (fleet.facts.queue)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import fleet.nodeside
from fleet.backends.hosts.prepare import connect
from fleet.backends.hosts.queue_stage import queue_job, stage
from fleet.backends.queueing import Queued
from fleet.config.inventory import Host, Inventory
from fleet.config.job import Job
from fleet.config.restart import Ending
from fleet.config.select import Selection, load_selected
from fleet.console import Console
from fleet.errors import RemoteCommandError, UsageError, host_error
from fleet.facts.leases import LEASE_DIR
from fleet.facts.probe import master_address
from fleet.facts.queue import QueueLook, look_script, parse_look
from fleet.nodeside.shared.queue_rules import ENDED, Spec, spec_json
from fleet.run.sweeps import SweepRecord
from fleet.shell import quote
from fleet.transport import Transport, open_transport
from fleet.transport.group import all_ok, each
from fleet.transport.sync import Entry
from fleet.transport.sync import send as send_bundle

PROGRAMS = ("queue_runner.py", "queue_agent.py", "lease.py")
RUNNER_WAIT_S = 15.0  # for a runner just started to say its port
CANCEL_WAIT_S = 90.0  # for the runs a stop stops to end


def queue_dir(t: Transport) -> str:
    return t.path(t.host.workdir.rstrip("/") + "/queue")


class HostsQueue:
    def __init__(self, inventory: Path) -> None:
        self.path = inventory

    def inventory(self, selection: Selection = Selection()) -> Inventory:  # noqa: B008
        return load_selected(self.path, selection)

    # ---- submit ---------------------------------------------------------------------------
    def submit(self, sweep: SweepRecord, runs: list[Queued], console: Console) -> SweepRecord:
        inventory = self.inventory(runs[0].job.selection)
        jobs = [Queued(q.run_id, queue_job(q.job), q.params, q.priority, q.expect_s)
                for q in runs]
        hosts = tuple(h.name for h in inventory.hosts)
        session = connect(inventory, console)
        try:
            entries, workdirs = stage(session, inventory, jobs, console)
            head = inventory.hosts[0].name
            key = self._key(session.transports[head])
            specs = [Spec(q.run_id, sweep.sweep_id, q.job.placement.gpus_per_node or 0,
                          q.priority, q.expect_s, time.time(), attempts(q.job), hosts,
                          dict(q.job.metrics))
                     for q in jobs]

            def send(name: str) -> None:
                t = session.transports[name]
                q = queue_dir(t)
                more = [Entry(f"{q}/key", 0o600, data=key.encode()),
                        *(Entry(f"{q}/{p}", 0o600, data=(fleet.nodeside.text(p) + "\n").encode())
                          for p in PROGRAMS),
                        *(Entry(f"{q}/runs/{s.run}.json", 0o600, data=spec_json(s).encode())
                          for s in specs)]
                if name == head:
                    more += [Entry(f"{q}/incoming/{sweep.sweep_id}/{s.run}.json", 0o600,
                                   data=spec_json(s).encode()) for s in specs]
                t.run(f"mkdir -p -m 700 {quote(q)} && chmod 700 {quote(q)}",
                      what="make the queue's directory").check(name)
                send_bundle(t, entries[name] + more, sweep.sweep_id)

            all_ok("queue", each(((h, h) for h in hosts), send))
            addr = master_address(inventory, session.facts.get(head))
            port = self._enqueue(session.transports[head], sweep.sweep_id, addr)
            all_ok("start the queue's agents", each(
                ((h.name, h) for h in inventory.hosts),
                lambda h: self._agent(session.transports[h.name], h, addr, port)))
        finally:
            session.close()
        console.info(f"sweep {sweep.sweep_id}: {len(runs)} run(s) queued; the runner on {head} "
                     f"({addr}:{port}) places them, with nothing more needed here")
        return dataclasses.replace(sweep, workdirs=workdirs)

    def _key(self, t: Transport) -> str:
        """The queue's key, made once on the queue's host under its lock (two first submits
        at once get the same one), read back, then sent to every host."""
        q = quote(queue_dir(t))
        python = quote(t.path(t.host.python))
        r = t.run("\n".join([
            f"q={q}", 'mkdir -p -m 700 "$q" && chmod 700 "$q" || exit 3',
            'exec 8>>"$q/lock"', "command -v flock >/dev/null 2>&1 && flock -x 8",
            '[ -s "$q/key" ] || { (umask 077; '
            f"{python} -I -S -c 'import secrets; print(secrets.token_hex(32))' "
            '> "$q/key.tmp") && mv -f "$q/key.tmp" "$q/key"; }',
            'head -c 200 "$q/key"']), what="make the queue's key")
        have = r.out.strip()
        if not r.ok or len(have) != 64 or any(c not in "0123456789abcdef" for c in have):
            raise RemoteCommandError(t.host.name, "make the queue's key", r.code, r.out + r.err)
        return have

    def _enqueue(self, t: Transport, sweep: str, addr: str) -> int:
        """Under the queue's lock: the sweep's runs into jobs/, and the runner started where
        none lives; its port."""
        q = quote(queue_dir(t))
        python = quote(t.path(t.host.python))
        script = "\n".join([
            "set -u", f"q={q}", 'mkdir -p "$q/jobs" "$q/cancel"',
            'exec 8>>"$q/lock"', "command -v flock >/dev/null 2>&1 && flock -x 8",
            *([f'i="$q/incoming/"{quote(sweep)}',
               'if [ -d "$i" ]; then mv -f "$i"/*.json "$q/jobs/" || exit 3; rmdir "$i"; fi']
              if sweep else []),
            "port() { sed -n 's/.*\"port\": *\\([0-9]*\\).*/\\1/p' \"$q/runner.json\" "
            "2>/dev/null; }",
            "pid=$(sed -n 's/.*\"pid\": *\\([0-9]*\\).*/\\1/p' \"$q/runner.json\" 2>/dev/null)",
            'if [ -n "$pid" ] && [ -O "/proc/$pid" ] && tr "\\0" " " < "/proc/$pid/cmdline" '
            '2>/dev/null | grep -qF "$q/queue_runner.py"; then port; exit 0; fi',
            'rm -f "$q/runner.json"',
            f'setsid {python} -I -S "$q/queue_runner.py" "$q" {quote(addr)} < /dev/null '
            '>> "$q/runner.log" 2>&1 8>&- &',
            f"i=0; while [ ! -s \"$q/runner.json\" ] && [ $i -lt {int(RUNNER_WAIT_S * 10)} ]; "
            "do sleep 0.1; i=$((i + 1)); done",
            'port; [ -s "$q/runner.json" ] || { tail -n 5 "$q/runner.log" >&2; exit 4; }'])
        r = t.run(script, timeout=RUNNER_WAIT_S + 30, what="queue the runs")
        port = r.out.strip().splitlines()[-1:] if r.ok else []
        if not port or not port[0].isdigit() or not 0 < int(port[0]) < 65536:
            raise RemoteCommandError(t.host.name, "start the queue's runner", r.code,
                                     r.out + r.err)
        return int(port[0])

    def _agent(self, t: Transport, host: Host, addr: str, port: int) -> None:
        q = quote(queue_dir(t))
        allowed = ",".join(map(str, host.gpus)) if host.gpus else "all"
        workdir = quote(t.path(host.workdir))
        script = "\n".join([
            f"q={q}", f"printf '%s %s\\n' {quote(addr)} {port} > \"$q/runner.addr.tmp\"",
            'mv -f "$q/runner.addr.tmp" "$q/runner.addr"',
            f"h={quote(host.name)}",
            'if command -v flock >/dev/null 2>&1 && ! flock -n "$q/agent-$h.lock" true; then '
            "exit 0; fi",
            f'setsid {quote(t.path(host.python))} -I -S "$q/queue_agent.py" "$q" "$h" '
            f'{workdir} {quote(LEASE_DIR)} {quote(allowed)} < /dev/null '
            '>> "$q/agent-$h.log" 2>&1 &'])
        t.run(script, timeout=30, what="start the queue's agent").check(host.name)

    # ---- looks ----------------------------------------------------------------------------
    def look(self) -> QueueLook:
        inventory = self.inventory()
        head = inventory.hosts[0]
        try:
            t = open_transport(head)
        except Exception as e:  # noqa: BLE001 - said as the host's failure
            raise host_error("look at the queue", {head.name: e}) from e
        try:
            r = t.run(look_script(queue_dir(t)), timeout=30, what="look at the queue")
        finally:
            t.close()
        if not r.ok:
            raise RemoteCommandError(head.name, "look at the queue", r.code, r.out + r.err)
        return parse_look(r.out, {h.name for h in inventory.hosts}, head.user or "")

    def cancel(self, names: list[str], console: Console) -> QueueLook:
        inventory = self.inventory()
        head = inventory.hosts[0]
        t = open_transport(head)
        try:
            q = quote(queue_dir(t))
            t.run(f"mkdir -p {q}/cancel && " + " && ".join(
                f"touch {q}/cancel/{quote(n)}" for n in names), what="stop the sweep").check(
                head.name)
        finally:
            t.close()
        deadline = time.monotonic() + CANCEL_WAIT_S
        revived = False
        while True:
            seen = self.look()
            mine = [r for run, r in seen.runs.items() if run in names or _sweep_of(run, names)]
            if all(r.state in ENDED for r in mine):
                return seen
            if not seen.alive and not revived:
                # its runner is gone (its host restarted): a new one hears the stop and tells
                # the agents, which still run what they started
                self._revive(inventory, console)
                revived = True
            if time.monotonic() > deadline:
                raise UsageError(f"the queue's runs did not all stop within {CANCEL_WAIT_S:.0f} "
                                 "s; `fleet sweep status` says where they are")
            time.sleep(1.0)

    def _revive(self, inventory: Inventory, console: Console) -> None:
        """A runner again, at the address the agents were given, and every agent told it."""
        session = connect(inventory, console)
        try:
            head = session.transports[inventory.hosts[0].name]
            r = head.run(f"cat {quote(queue_dir(head) + '/runner.addr')} 2>/dev/null; exit 0",
                         what="read the runner's address")
            words = r.out.split()
            addr = words[0] if words and all(c.isalnum() or c in ".:-_" for c in words[0]) else (
                master_address(inventory, None))
            port = self._enqueue(head, "", addr)
            all_ok("start the queue's agents", each(
                ((h.name, h) for h in inventory.hosts),
                lambda h: self._agent(session.transports[h.name], h, addr, port)))
        finally:
            session.close()


def attempts(job: Job) -> int:
    """How many times a queued run may start: again after a lost host where [restart] says
    so (its `max`, with `lost` among its `on`)."""
    return 1 + job.restart.max if Ending.LOST in job.restart.on else 1


def _sweep_of(run: str, names: list[str]) -> bool:
    """A sweep's runs are named `<sweep id>-<n>`."""
    return any(run.startswith(n + "-") for n in names)


