"""The rules of the nodes' own watchers (fleet/nodeside/watcher.py), pure: the words they send
each other (one line each, HMAC-signed with the run's token over the other side's nonce, parsed
as untrusted input) and what a watcher decides from what it has heard: to go on, or to stop
every node's part and why. The laptop imports the same module (its tests, the config it
writes)."""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any

from fleet.nodeside.shared.heal_rules import Heal, parse_heal

MAX_LINE = 1024  # bytes of one message, its newline included: a longer line ends the link
NONCE_BYTES = 16  # each side's challenge, sent first on a connection, as hex
MAX_WHY = 300  # characters of a stop's reason
KINDS = ("beat", "end", "stop", "heal")
SAID_BY = "the nodes' watchers"  # how a stop record says who decided


class BadMessage(ValueError):
    """A line that is no message of this run's watchers: the link it came on is dropped."""


@dataclass(frozen=True)
class Message:
    """What one watcher tells another: `beat` (alive), `end` (its node's part ended, with its
    exit code, None: killed outright), `stop` (the master's order to stop, with the reason and
    the node that set it off), `heal` (the master's order to stop this attempt's part and start
    the next attempt's, prepared already: the reason, the node lost, the spare in its place)."""

    kind: str
    node: str
    seq: int
    code: int | None = None
    why: str = ""
    culprit: str = ""
    spare: str = ""


def sign(token: bytes, nonce: str, body: str) -> str:
    return hmac.new(token, f"{nonce}|{body}".encode(), hashlib.sha256).hexdigest()


def encode(token: bytes, nonce: str, m: Message) -> bytes:
    """One line: `<hmac> <json>`, the hmac over the receiver's nonce and the json."""
    fields: dict[str, object] = {"k": m.kind, "n": m.node, "s": m.seq}
    if m.kind == "end":
        fields["c"] = m.code
    if m.kind in ("stop", "heal"):
        fields["why"], fields["by"] = m.why[:MAX_WHY], m.culprit
    if m.kind == "heal":
        fields["sp"] = m.spare
    body = json.dumps(fields, separators=(",", ":"), sort_keys=True)
    line = f"{sign(token, nonce, body)} {body}\n".encode()
    if len(line) > MAX_LINE:
        raise ValueError("a watcher's message longer than MAX_LINE")
    return line


def parse_nonce(line: bytes) -> str:
    """The other side's first line, `nonce <hex>`."""
    if len(line) > MAX_LINE:
        raise BadMessage("a nonce line too long")
    words = line.decode("ascii", "replace").split()
    if len(words) != 2 or words[0] != "nonce" or len(words[1]) != 2 * NONCE_BYTES or any(
            c not in "0123456789abcdef" for c in words[1]):
        raise BadMessage("no nonce")
    return words[1]


def _printable(text: str) -> bool:
    return all(c.isprintable() for c in text)


def signed_object(line: bytes, token: bytes, nonce: str, most: int) -> dict[str, Any]:
    """The JSON object of a line `<hmac> <json>\n` of at most `most` bytes, signed with
    `token` over this side's `nonce`; BadMessage otherwise (the watchers' and the queue's)."""
    if len(line) > most or not line.endswith(b"\n"):
        raise BadMessage("a line too long or cut short")
    try:
        text = line[:-1].decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadMessage("not UTF-8") from e
    mac, sep, body = text.partition(" ")
    if not sep or not hmac.compare_digest(mac.encode(), sign(token, nonce, body).encode()):
        raise BadMessage("a bad signature")
    try:
        got = json.loads(body)
    except ValueError as e:
        raise BadMessage("not JSON") from e
    if not isinstance(got, dict):
        raise BadMessage("not an object")
    return got


def parse(line: bytes, token: bytes, nonce: str, nodes: frozenset[str], after: int) -> Message:
    """A message from another watcher, checked: at most MAX_LINE bytes, signed with the run's
    token over this side's `nonce`, a JSON object of exactly the fields its kind has, from one
    of the run's `nodes`, numbered above `after` (no replay within a link). BadMessage
    otherwise."""
    got = signed_object(line, token, nonce, MAX_LINE)
    kind, node, seq = got.get("k"), got.get("n"), got.get("s")
    extra = {"end": {"c"}, "stop": {"why", "by"}, "heal": {"why", "by", "sp"}}.get(
        kind if isinstance(kind, str) else "", set())
    if kind not in KINDS or set(got) != {"k", "n", "s"} | extra:
        raise BadMessage("not a message's fields")
    if not isinstance(node, str) or node not in nodes:
        raise BadMessage("from no node of the run")
    if type(seq) is not int or seq <= after or seq >= 1 << 53:
        raise BadMessage("out of order")
    code = got.get("c")
    if kind == "end" and code is not None and (type(code) is not int or not 0 <= code < 256):
        raise BadMessage("no exit code")
    why, by, spare = got.get("why", ""), got.get("by", ""), got.get("sp", "")
    ordered = kind in ("stop", "heal")
    if ordered and (not isinstance(why, str) or not isinstance(by, str)
                    or len(why) > MAX_WHY or not _printable(why)
                    or (by and by not in nodes)):
        raise BadMessage("no reason to stop")
    if kind == "heal" and (not by or not isinstance(spare, str) or spare not in nodes
                           or spare == by):
        raise BadMessage("no node lost or no spare in its place")
    return Message(kind, node, seq, code if kind == "end" else None, why if ordered else "",
                   by if ordered else "", spare if kind == "heal" else "")


# ---- decisions ----------------------------------------------------------------------------
@dataclass
class Peer:
    """What the master's watcher knows of another node: when it last heard from it (None:
    never), whether its part has ended and how (`code`: None, killed outright)."""

    seen: float | None = None
    ended: bool = False
    code: int | None = None


@dataclass
class Hub:
    """The master's view: every other node, since when it watches."""

    master: str
    since: float
    after: float  # unreachable_after: silence that makes a node lost
    hello_within: float  # how long a node's watcher may take to reach the master's at first
    peers: dict[str, Peer] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """Stop every node's part: why (the stop record's words), which node set it off, and
    whether it was lost (silent), not failed: a loss of a node other than the master is what a
    prepared next attempt heals (fleet.nodeside.shared.heal_rules)."""

    why: str
    culprit: str
    lost: bool = False


def failed(node: str, code: int | None) -> Verdict:
    how = "killed outright" if code is None else f"exit {code}"
    return Verdict(f"fail-fast: {node} failed ({how}; seen by {SAID_BY})", node)


def lost(node: str, seconds: float, never: bool = False) -> Verdict:
    how = (f"its watcher never reached the master's in {seconds:g}s" if never
           else f"no word from it for {seconds:g}s")
    return Verdict(f"fail-fast: {node} unreachable ({how}; seen by {SAID_BY})", node, True)


def hub_decide(hub: Hub, now: float, own_end: tuple[bool, int | None]) -> Verdict | None:
    """The master's decision: a node whose part ended non-zero (its own, or the master's:
    `own_end` = (ended, code)), or one not heard of for `after` (or never within
    `hello_within`), stops the run; else None. Every other node silent at once (two or more)
    names the master itself, cut off. A node whose part succeeded is silent by right."""
    ended, code = own_end
    if ended and code != 0:
        return failed(hub.master, code)
    going = [p for p in hub.peers.values() if not p.ended or p.code != 0]
    if len(going) > 1 and all(p.seen is not None and now - p.seen > hub.after for p in going):
        # Every other node silent at once: the master is the one cut off, as far as it can tell.
        return Verdict(f"fail-fast: {hub.master} cut off (no word from any other node for "
                       f"{hub.after:g}s; seen by {SAID_BY})", hub.master, True)
    for name in sorted(hub.peers):
        p = hub.peers[name]
        if p.ended:
            if p.code != 0:
                return failed(name, p.code)
            continue
        if p.seen is None:
            if now - hub.since > hub.hello_within:
                return lost(name, hub.hello_within, never=True)
        elif now - p.seen > hub.after:
            return lost(name, hub.after)
    return None


def hub_done(hub: Hub, own_ended: bool) -> bool:
    """Whether the master's watcher may end: its part and every other node's have ended."""
    return own_ended and all(p.ended for p in hub.peers.values())


def spoke_decide(master: str, since: float, seen: float | None, now: float, after: float,
                 hello_within: float) -> Verdict | None:
    """Another node's decision about the master's watcher (its part's own end is told to the
    master, which decides): not heard of for `after` (never, within `hello_within`) is lost."""
    if seen is None:
        return lost(master, hello_within, never=True) if now - since > hello_within else None
    return lost(master, after) if now - seen > after else None


# ---- the watcher's config, which fleet writes --------------------------------------------
@dataclass(frozen=True)
class Config:
    """One node's watcher's: the run and this node, the run's nodes (the master first), where
    the master's watcher listens (port 0 on the master: any free one), the run's token, this
    node's stop key (what stop.sh asks), and the timings; `heal`: the next attempt, prepared
    (a detached run with `[restart]` and spares), where a standby spare's watcher is `node`,
    none of `nodes`."""

    run: str
    node: str
    nodes: tuple[str, ...]
    addr: str
    port: int
    token: str
    key: str
    after: float
    hello_within: float
    heal: Heal | None = None

    @property
    def master(self) -> bool:
        return self.node == self.nodes[0]

    @property
    def standby(self) -> bool:
        return self.node not in self.nodes

    @property
    def everyone(self) -> frozenset[str]:
        """Whom messages may come from: the run's nodes and its standby spares."""
        return frozenset(self.nodes) | frozenset(self.heal.spares if self.heal else ())

    def dumps(self) -> str:
        return json.dumps({"run": self.run, "node": self.node, "nodes": list(self.nodes),
                           "addr": self.addr, "port": self.port, "token": self.token,
                           "key": self.key, "after": self.after,
                           "hello_within": self.hello_within,
                           **({"heal": self.heal.as_obj()} if self.heal else {})},
                          sort_keys=True)


def parse_config(text: str) -> Config:
    """watch.json, checked (ValueError naming what is wrong)."""
    got = json.loads(text)
    if not isinstance(got, dict):
        raise ValueError("not an object")
    nodes = got.get("nodes")
    if not isinstance(nodes, list) or not nodes or not all(isinstance(n, str) for n in nodes):
        raise ValueError("nodes: not a list of names")
    heal = parse_heal(got["heal"]) if "heal" in got else None
    strings = ("run", "node", "addr", "token", "key")
    if not all(isinstance(got.get(k), str) for k in strings) or got["node"] not in (
            *nodes, *(heal.spares if heal else ())):
        raise ValueError(f"one of {', '.join(strings)} is not a string, or node not in nodes")
    port, after, hello = got.get("port"), got.get("after"), got.get("hello_within")
    if type(port) is not int or not 0 <= port < 65536:
        raise ValueError("port: not a port")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
               for v in (after, hello)):
        raise ValueError("after, hello_within: not positive numbers")
    return Config(got["run"], got["node"], tuple(nodes), got["addr"], port, got["token"],
                  got["key"], float(after), float(hello), heal)  # type: ignore[arg-type]


def beat_every(after: float) -> float:
    """How often a watcher says it is alive: four times within `after`, at most once a second."""
    return min(1.0, max(0.1, after / 4))
