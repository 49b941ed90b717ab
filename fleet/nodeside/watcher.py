"""The nodes' own watcher of a detached run: fail-fast without the laptop. start.sh starts one
beside each node's wrapper, with FLEET_ATTEMPT_ID in its environment (so a stop of the run ends
it too). Each non-master node's watcher keeps a TCP link to the master's, with a signed beat every
beat_every(unreachable_after); every rule is fleet.nodeside.shared.watch_rules. When a node's
part ends non-zero, or a node is not heard of for unreachable_after, the master's watcher tells
every other to stop, and each runs its node's stop.sh with the reason (the stop record `fleet
status` reads); a node that loses the master stops its own part. It ends with its node's part
(the master's: once every node's has ended), or once it has stopped it. argv: the run
directory, the wrapper's pid and start time (clock ticks after boot); stdin: its config
(fleet.nodeside.shared.watch_rules.Config), which start.sh read from the run directory and
removed before the job began."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time

from fleet.nodeside.shared.heal_rules import HEALED, Healing, choose, dumps_healed, unhealed
from fleet.nodeside.shared.nodemap import ATTEMPT_ID_VAR, RUN_ID_VAR, WATCHER_CONFIG, WATCHER_PORT
from fleet.nodeside.shared.watch_link import Link, listen, part_ended, say
from fleet.nodeside.shared.watch_rules import (
    BadMessage,
    Config,
    Hub,
    Peer,
    Verdict,
    beat_every,
    hub_decide,
    hub_done,
    parse_config,
    spoke_decide,
)

STOP_WAIT_S = 30  # how long the watcher waits for stop.sh to end it, before it ends by itself
MAX_LINKS = 4  # links the master's watcher holds per node of the run, strangers' included


def dial(cfg: Config, beat: float) -> Link | None:
    """A link to the master's watcher; None where it does not answer (tried again later)."""
    try:
        return Link(socket.create_connection((cfg.addr, cfg.port), timeout=beat))
    except OSError:
        return None


def stop_part(run_dir: str, cfg: Config, wrapper: str, verdict: Verdict) -> None:
    """Run the node's stop.sh with the reason, outside the run's environment and session (it
    ends this watcher too, which is the run's), then wait for it to do so."""
    say(run_dir, f"stopping this node's part ({verdict.why})")
    env = {k: v for k, v in os.environ.items() if k not in (RUN_ID_VAR, ATTEMPT_ID_VAR)}
    p = subprocess.Popen(["sh", os.path.join(run_dir, "stop.sh"), verdict.why],
                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    assert p.stdin is not None
    p.stdin.write(f"{cfg.key}\n{wrapper}\n".encode())
    p.stdin.close()
    time.sleep(STOP_WAIT_S)


# Runs stop.sh (the key and the wrapper on its stdin, never on a command line), then the next
# attempt's heal.sh with the node lost: outside the run's environment and session, so that the
# stop, which ends this watcher, does not end it.
HEAL_SH = """IFS= read -r k <&3; IFS= read -r w <&3; exec 3<&-
[ -n "$1" ] && printf '%s\\n%s\\n' "$k" "$w" | sh "$1" "$2"
exec sh "$3" "$4" < /dev/null >> "$3.log" 2>&1
"""


def heal_part(run_dir: str, cfg: Config, wrapper: str, healing: Healing, running: bool) -> None:
    """Stop this attempt's part of the node (where it still runs) and start the next
    attempt's, as prepared (a standby spare: start it alone); the stop ends this watcher, the
    next attempt has watchers of its own."""
    assert cfg.heal is not None
    say(run_dir, f"{healing.why}: starting this node's part of attempt {healing.attempt}")
    env = {k: v for k, v in os.environ.items() if k not in (RUN_ID_VAR, ATTEMPT_ID_VAR)}
    stop = os.path.join(run_dir, "stop.sh") if running else ""
    # In the background of a shell that ends at once: no child of this watcher, which the
    # stop finds by its environment, and with it every process descended from it.
    p = subprocess.Popen(["sh", "-c", f"exec 3<&0; ({HEAL_SH}) &", "sh", stop, healing.why,
                          cfg.heal.script, healing.lost], stdin=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                         start_new_session=True)
    assert p.stdin is not None
    p.wait()
    p.stdin.write(f"{cfg.key}\n{wrapper}\n".encode())
    p.stdin.close()
    if running:
        time.sleep(STOP_WAIT_S)


def hub(run_dir: str, cfg: Config, pid: int, start: int) -> None:
    token, nodes = cfg.token.encode(), cfg.everyone
    server = listen(cfg.addr, cfg.port)
    server.listen(len(cfg.nodes) + 4)
    server.setblocking(False)
    port = os.path.join(run_dir, WATCHER_PORT)
    with open(port + ".tmp", "w", encoding="ascii") as f:
        f.write(f"{server.getsockname()[1]}\n")
    os.replace(port + ".tmp", port)
    state = Hub(cfg.node, time.monotonic(), cfg.after, cfg.hello_within,
                {n: Peer() for n in cfg.nodes[1:]})
    standby: dict[str, float | None] = {s: None for s in (cfg.heal.spares if cfg.heal else ())}
    links: list[Link] = []
    beat, last_beat = beat_every(cfg.after), 0.0
    wrapper = f"{pid} {start}"
    while True:
        ready, _, _ = select.select([server, *(x.sock for x in links)], [], [], beat / 2)
        now = time.monotonic()
        for sock in ready:
            if sock is server:
                try:
                    conn, _ = server.accept()
                    if len(links) < MAX_LINKS * len(cfg.nodes):
                        links.append(Link(conn, now))
                    else:
                        conn.close()
                except OSError:
                    pass
                continue
            link = next(x for x in links if x.sock is sock)
            try:
                for m in link.receive(token, nodes):
                    if m.node in standby:
                        standby[m.node] = now
                    if m.node in state.peers:
                        state.peers[m.node].seen = now
                        if m.kind == "end":
                            state.peers[m.node].ended, state.peers[m.node].code = True, m.code
            except (OSError, BadMessage):
                link.close()
                links.remove(link)
        for link in [x for x in links if state.peers.get(x.node, Peer()).ended or (
                not x.node and now - x.opened > cfg.after)]:
            link.close()  # told its end (its watcher may go), or a stranger's
            links.remove(link)
        own = part_ended(run_dir, pid, start)
        verdict = hub_decide(state, now, own)
        healing = None if verdict is None else choose(
            cfg.node, verdict.culprit, verdict.lost, cfg.heal, standby, now, cfg.after,
            time.time())
        if healing is not None:
            say(run_dir, f"healing the run: {healing.why}")
            healed = os.path.join(run_dir, HEALED)
            with open(healed + ".tmp", "w", encoding="utf-8") as f:
                f.write(dumps_healed(healing))
            os.replace(healed + ".tmp", healed)
            for link in links:
                link.send(token, "heal", cfg.node, why=healing.why, culprit=healing.lost,
                          spare=healing.spare)
                link.close()
            heal_part(run_dir, cfg, wrapper, healing, not own[0])
            return
        if verdict is not None:
            verdict = Verdict(unhealed(verdict.why, verdict.culprit, verdict.lost, cfg.node,
                                       cfg.heal), verdict.culprit)
            say(run_dir, f"stopping the run: {verdict.why}")
            for link in links:
                link.send(token, "stop", cfg.node, why=verdict.why, culprit=verdict.culprit)
                link.close()
            if not own[0]:
                stop_part(run_dir, cfg, wrapper, verdict)
            return
        if hub_done(state, own[0]):
            return
        if now - last_beat >= beat:
            last_beat = now
            for link in links:
                link.send(token, "beat", cfg.node)


def spoke(run_dir: str, cfg: Config, pid: int, start: int) -> None:
    token, nodes, master = cfg.token.encode(), cfg.everyone, cfg.nodes[0]
    since, seen = time.monotonic(), None
    beat, last_beat, last_try = beat_every(cfg.after), 0.0, -1e9
    link: Link | None = None
    wrapper = f"{pid} {start}"
    while True:
        now = time.monotonic()
        if link is None and now - last_try >= beat:
            last_try, link = now, dial(cfg, beat)
        if link is None:
            time.sleep(beat / 2)
        ready = select.select([link.sock], [], [], beat / 2)[0] if link else []
        now = time.monotonic()
        own = part_ended(run_dir, pid, start)
        if link is not None and ready:
            try:
                for m in link.receive(token, nodes):
                    if m.node != master:
                        raise BadMessage("not the master's")
                    seen = now
                    if m.kind == "heal" and cfg.heal is not None:
                        link.close()
                        heal_part(run_dir, cfg, wrapper, Healing(
                            cfg.heal.attempt, cfg.heal.run, m.culprit, m.spare, m.why, 0.0),
                            not own[0])
                        return
                    if m.kind in ("stop", "heal"):
                        link.close()
                        if not own[0]:
                            stop_part(run_dir, cfg, wrapper, Verdict(m.why, m.culprit))
                        return
            except (OSError, BadMessage):
                link.close()
                link = None
                if own[0] and seen is not None:
                    return  # the master closes the link once it has the end
        verdict = spoke_decide(master, since, seen, now, cfg.after, cfg.hello_within)
        if verdict is not None:  # nobody is left to heal the run
            verdict = Verdict(unhealed(verdict.why, master, True, master, cfg.heal),
                              verdict.culprit, verdict.lost)
        if verdict is not None:
            if not own[0]:
                stop_part(run_dir, cfg, wrapper, verdict)
            return
        if link is not None and (own[0] or now - last_beat >= beat):
            last_beat = now
            if not (link.send(token, "end", cfg.node, code=own[1]) if own[0]
                    else link.send(token, "beat", cfg.node)) and link.theirs:
                link.close()
                link = None


def standby(run_dir: str, cfg: Config) -> None:
    """A standby spare's watcher: linked to the master's, it starts the next attempt's part
    here when the master names this spare in a `heal`; it ends with the master's watcher (a
    stop, any other end, its silence), having nothing of its own to stop."""
    assert cfg.heal is not None
    token, master, since, seen = cfg.token.encode(), cfg.nodes[0], time.monotonic(), None
    beat, last_beat, last_try = beat_every(cfg.after), 0.0, -1e9
    link: Link | None = None
    while spoke_decide(master, since, seen, time.monotonic(), cfg.after,
                       cfg.hello_within) is None:
        now = time.monotonic()
        if link is None and now - last_try >= beat:
            last_try, link = now, dial(cfg, beat)
        if link is None:
            time.sleep(beat / 2)
            continue
        if select.select([link.sock], [], [], beat / 2)[0]:
            try:
                for m in link.receive(token, cfg.everyone):
                    if m.node != master:
                        raise BadMessage("not the master's")
                    seen = time.monotonic()
                    if m.kind == "heal" and m.spare == cfg.node:
                        heal_part(run_dir, cfg, "", Healing(
                            cfg.heal.attempt, cfg.heal.run, m.culprit, m.spare, m.why, 0.0),
                            False)
                    if m.kind in ("stop", "heal"):
                        link.close()
                        return
            except (OSError, BadMessage):
                link.close()
                link = None
                if seen is not None:
                    return  # the master's watcher ended: so does the run's standby
        if link is not None and time.monotonic() - last_beat >= beat:
            last_beat = time.monotonic()
            link.send(token, "beat", cfg.node)


def main() -> None:
    run_dir, pid, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    try:  # start.sh removed the file before the job began: its keys are in this process alone
        cfg = parse_config(sys.stdin.read(65536))
    except (OSError, ValueError) as e:
        say(run_dir, f"not started: {WATCHER_CONFIG}: {e}")
        return
    try:
        if cfg.standby:
            standby(run_dir, cfg)
        else:
            (hub if cfg.master else spoke)(run_dir, cfg, pid, start)
    except Exception as e:  # said where `fleet logs` shows it; the run goes on unwatched
        say(run_dir, f"ended unexpectedly: {e!r}")
        raise


if __name__ == "__main__":
    main()
