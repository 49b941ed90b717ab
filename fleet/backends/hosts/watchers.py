"""The nodes' own watchers of a detached run (fleet/nodeside/watcher.py), from the laptop's
side: each node's config (the run's token, the node's stop key, where the master's watcher
listens), written 0600 before the node starts; the port the master's watcher chose, read back
before the others start (fleet.run.watched marks the record)."""

from __future__ import annotations

import hashlib
import hmac

from fleet.errors import RemoteCommandError
from fleet.nodedata import number
from fleet.nodeside.shared import nodemap
from fleet.nodeside.shared.heal_rules import Heal
from fleet.nodeside.shared.watch_rules import Config
from fleet.plan import NodePlan, Plan
from fleet.shell import quote
from fleet.transport import Transport

PORT_WAIT_S = 15.0  # how long the master's watcher may take to listen


def token(secret: str, run_id: str) -> str:
    """The run's token that signs every message between its watchers: derived from the run's
    secret, which never leaves this machine, and told apart from every node's stop key."""
    return hmac.new(secret.encode(), f"watchers of {run_id}".encode(),
                    hashlib.sha256).hexdigest()


def config(plan: Plan, n: NodePlan, secret: str, key: str, port: int,
           heal: Heal | None = None) -> Config:
    """Node n's watcher's config; `port`: the master's watcher's (0 on the master: any free
    one, which it writes down); `heal`: the next attempt, prepared (fleet.backends.hosts.heal)."""
    after = plan.job.watchdog.unreachable_after
    return Config(plan.run_id, n.host.name, tuple(x.host.name for x in plan.nodes),
                  plan.master.master_addr, port, token(secret, plan.run_id), key, after,
                  max(3 * after, 30.0), heal)


def write_config(t: Transport, n: NodePlan, cfg: Config) -> None:
    """Before the node starts: start.sh opens it, removes it, and gives it to the watcher."""
    t.write(f"{n.run_dir}/{nodemap.WATCHER_CONFIG}", cfg.dumps().encode(), 0o600)


def port_script(run_dir: str, seconds: float) -> str:
    """Waits for the master's watcher to write its port, then prints it."""
    f = quote(f"{run_dir}/{nodemap.WATCHER_PORT}")
    return (f"i=0; while [ ! -s {f} ] && [ $i -lt {int(seconds * 10)} ]; do sleep 0.1; "
            f"i=$((i + 1)); done; head -c 16 {f} 2>/dev/null")


def parse_port(out: str) -> int | None:
    """The port the master's watcher wrote (the node's word: a number 1-65535, or nothing)."""
    port = number(out.strip(), 65536)
    return port if port else None


def master_port(t: Transport, run_dir: str) -> int:
    r = t.run(port_script(run_dir, PORT_WAIT_S), timeout=PORT_WAIT_S + 15,
              what="read the watcher's port")
    port = parse_port(r.out)
    if port is None:
        raise RemoteCommandError(t.host.name, "start the nodes' watcher", r.code,
                                 f"its port was not written within {PORT_WAIT_S:g}s "
                                 f"(see {run_dir}/{nodemap.NODE_LOG})")
    return port
