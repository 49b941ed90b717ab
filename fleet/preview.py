"""What a `fleet up` would move, said before anything moves (`fleet plan`): the local side from
the scans; with --probe, each node's side from a read-only listing (a command plus a pure
parser), summed per node, with the route by hosts.prepare's rule (a node whose changes pass
BUNDLE_MAX, or that holds a partial file of one, is streamed by transport.transfer, relayed node to
node in plan order; any other gets its changes in its one bundle)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from fleet.nodedata import number
from fleet.nodeside.ferry import part_name
from fleet.plan import Plan
from fleet.shell import AND, sh
from fleet.transport import Transport
from fleet.transport.group import each, reason
from fleet.transport.sync import Manifest, Scan, changed, parse_manifest
from fleet.transport.transfer import human, streams

NAMES_SHOWN = 3  # files named per directory in the text; --json names up to NAMES_MAX
NAMES_MAX = 1000
FIND_FORMAT = r"%P\t%s\t%T@\n"  # fleet.transport.sync.manifest_script's: parse_manifest reads it
RELAY_WORDS = ("each byte once over this machine's uplink; nodes pass it on over TCP, on an "
               "ephemeral port, authenticated per run; a node the one before cannot reach is "
               "fed from here directly")


# ---- the fact: a read-only listing of each synced directory -------------------------------------
def listing_script(dirs: list[str]) -> str:
    """One round trip that creates nothing (transport.sync.listing_script makes the directories):
    each directory's files after a `#dir N` line, or `#dir N absent` where it does not exist."""
    lines = []
    for i, d in enumerate(dirs):
        find = sh("find", ".", "-type", "f", "-printf", FIND_FORMAT)
        lines.append(f"if {sh('test', '-d', d)}; then echo '#dir {i}'; ( {sh('cd', d)} {AND} "
                     f"{find} ); else echo '#dir {i} absent'; fi")
    return "\n".join(lines) if lines else "true"


def parse_listing(out: str, count: int) -> list[Manifest | None]:
    """Per listed directory its manifest (transport.sync.parse_manifest), None where it is absent;
    a directory the output never names counts as absent."""
    parts: list[list[str] | None] = [None] * count
    at = -1
    for line in out.splitlines():
        mark = _marker(line, count)
        if mark is not None:
            at, present = mark
            parts[at] = [] if present else None
            continue
        part = parts[at] if 0 <= at < count else None
        if part is not None:
            part.append(line)
    return [None if p is None else parse_manifest("\n".join(p)) for p in parts]


def _marker(line: str, count: int) -> tuple[int, bool] | None:
    """(directory number, whether it exists) of a `#dir N` or `#dir N absent` line."""
    if not line.startswith("#dir "):
        return None
    word, _, rest = line[5:].partition(" ")
    n = number(word, count)
    return (n, rest == "") if n is not None and rest in ("", "absent") else None


# ---- what moves: pure ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Side:
    """One synced directory on this machine: its files and their bytes."""

    label: str  # "code" or "data"
    files: int
    bytes: int


def local_side(code: Scan, data: Scan | None) -> tuple[Side, ...]:
    return tuple(Side(label, len(s.manifest), sum(m[0] for m in s.manifest.values()))
                 for label, s in (("code", code), ("data", data)) if s is not None)


@dataclass(frozen=True)
class DirMove:
    """One synced directory on one node: the files that differ there (size or time, as
    transport.sync.changed compares), their bytes here, how many of them the node holds a partial
    file or an older copy of, and how many are the same."""

    label: str
    present: bool  # the directory exists on the node
    differ: tuple[str, ...]
    sizes: tuple[int, ...]  # of each file that differs, as it is here
    bytes: int
    partial: int
    older: int
    unchanged: int

    @property
    def held(self) -> int:
        return self.partial + self.older


def dir_move(label: str, local: Manifest, there: Manifest | None) -> DirMove:
    have = there or {}
    rels = changed(local, have)
    partial = sum(1 for r in rels if part_name(r) in have)
    older = sum(1 for r in rels if r in have and part_name(r) not in have)
    sizes = tuple(local[r][0] for r in rels)
    return DirMove(label, there is not None, tuple(rels), sizes, sum(sizes), partial, older,
                   len(local) - len(rels))


class How(Enum):
    """How one node would get the files (`fleet plan --json` says the word)."""

    STREAM = "stream"  # relayed along the chain of streamed nodes
    BUNDLE = "bundle"  # in one bundle of its own
    NOTHING = "nothing"  # every file is there already
    SHARED = "shared"  # it sees its leader's storage
    UNLISTED = "unlisted"  # its listing failed


class RouteKind(Enum):
    """The route's shape, as `fleet plan --json` says it."""

    RELAY = "relay"  # through more than one streamed node
    DIRECT = "direct"  # to one streamed node
    BUNDLE = "bundle"  # bundles alone
    NOTHING = "nothing"


@dataclass(frozen=True)
class NodeMove:
    """What one node would get: its directories, and how (SHARED: `shares` names its leader;
    UNLISTED: `why` says why its listing failed)."""

    host: str
    how: How
    dirs: tuple[DirMove, ...] = ()
    shares: str | None = None
    why: str = ""

    @property
    def bytes(self) -> int:
        """The bytes of every file that differs: what moves at most (exactly, where the node
        holds nothing of them or gets them in its bundle)."""
        return sum(d.bytes for d in self.dirs)


def how_sent(dirs: tuple[DirMove, ...]) -> How:
    """hosts.prepare's rule (transport.transfer.streams); NOTHING where no file differs."""
    if streams(sum(d.bytes for d in dirs), any(d.partial for d in dirs)):
        return How.STREAM
    return How.BUNDLE if any(d.differ for d in dirs) else How.NOTHING


@dataclass(frozen=True)
class Route:
    """How the bytes would leave this machine: the streamed nodes in relay order, the nodes
    that get a bundle, and at most how many bytes cross this machine's uplink (a streamed file
    once; each bundle on its own)."""

    chain: tuple[str, ...]
    bundled: tuple[str, ...]
    uplink: int

    @property
    def kind(self) -> RouteKind:
        if len(self.chain) > 1:
            return RouteKind.RELAY
        return RouteKind.DIRECT if self.chain else RouteKind.BUNDLE if self.bundled else \
            RouteKind.NOTHING


def route(nodes: tuple[NodeMove, ...]) -> Route:
    chain = tuple(n.host for n in nodes if n.how is How.STREAM)
    bundled = tuple(n.host for n in nodes if n.how is How.BUNDLE)
    # A file streamed to several nodes leaves here once (the union of what they lack); each
    # bundle leaves on its own.
    streamed = {(d.label, rel): size for n in nodes if n.how is How.STREAM for d in n.dirs
                for rel, size in zip(d.differ, d.sizes, strict=True)}
    return Route(chain, bundled, sum(streamed.values()) +
                 sum(n.bytes for n in nodes if n.how is How.BUNDLE))


@dataclass(frozen=True)
class Preview:
    """The whole answer: the local side; with a probe, per node and the route."""

    local: tuple[Side, ...]
    nodes: tuple[NodeMove, ...] | None = None  # None: the nodes were not asked
    route: Route | None = None
    unknown_storage: tuple[str, ...] = ()  # nodes whose storage is not known yet


def synced(plan: Plan) -> dict[str, list[tuple[str, str]]]:
    """Per leader node (the first of each storage group) its synced directories on the node,
    (label, path)."""
    leaders = {g[0] for g in plan.storage}
    out = {}
    for n in plan.nodes:
        if n.host.name in leaders:
            out[n.host.name] = [("code", n.code_dir)] + (
                [("data", n.data_dir)] if n.data_dir and plan.job.data else [])
    return out


def preview(plan: Plan, code: Scan, data: Scan | None,
            listings: Mapping[str, list[Manifest | None] | str] | None = None,
            unknown_storage: tuple[str, ...] = ()) -> Preview:
    """From the scans and, per leader node, its listing (in synced()'s order) or why it could
    not be listed; without listings, the local side alone."""
    local = local_side(code, data)
    if listings is None:
        return Preview(local)
    scans = {"code": code.manifest, "data": data.manifest if data is not None else {}}
    leader = {name: g[0] for g in plan.storage for name in g}
    dirs = synced(plan)
    nodes = []
    for n in plan.nodes:
        name = n.host.name
        if leader[name] != name:
            nodes.append(NodeMove(name, How.SHARED, shares=leader[name]))
            continue
        got = listings.get(name, "not listed")
        if isinstance(got, str):
            nodes.append(NodeMove(name, How.UNLISTED, why=got))
            continue
        moves = tuple(dir_move(label, scans[label], there)
                      for (label, _), there in zip(dirs[name], got, strict=True))
        nodes.append(NodeMove(name, how_sent(moves), moves))
    return Preview(local, tuple(nodes), route(tuple(nodes)), unknown_storage)


# ---- words --------------------------------------------------------------------------------------
def _count(n: int) -> str:
    return f"{n} file(s)"


def _names(d: DirMove) -> str:
    shown = ", ".join(d.differ[:NAMES_SHOWN])
    more = len(d.differ) - NAMES_SHOWN
    return f" ({shown}{f' and {more} more' if more > 0 else ''})" if d.differ else ""


def _dir_line(d: DirMove, how: How) -> str:
    text = f"{d.label}: {_count(len(d.differ))} differ{_names(d)}, {human(d.bytes)}"
    if how is How.STREAM and d.held:
        held = [f"{k} with {what} there" for k, what in ((d.partial, "a partial file"),
                                                         (d.older, "an older copy")) if k]
        text += (f"; {' and '.join(held)}: compared block by block, only the blocks that "
                 "differ move (none where only the time changed)")
    elif how is How.BUNDLE and d.differ:
        text += " (sent whole)"
    text += f"; {d.unchanged} unchanged"
    return text + ("" if d.present else f" (no {d.label} directory there yet)")


def _node_line(n: NodeMove) -> str:
    if n.how is How.SHARED:
        return f"{n.host}: shares {n.shares}'s storage: nothing sent"
    if n.how is How.UNLISTED:
        return f"{n.host}: could not be listed: {n.why}"
    if n.how is How.NOTHING:
        return f"{n.host}: 0 bytes: nothing to send"
    if n.how is How.BUNDLE:
        return f"{n.host}: {human(n.bytes)} in its one bundle"
    held = any(d.held for d in n.dirs)
    return f"{n.host}: {'at most ' if held else ''}{human(n.bytes)} to stream"


def route_line(r: Route) -> str:
    way = " -> ".join(("this machine", *r.chain))
    bundles = f"{', '.join(r.bundled)}: in one bundle per node"
    if r.kind is RouteKind.RELAY:
        text = f"{way} ({RELAY_WORDS})"
    elif r.kind is RouteKind.DIRECT:
        text = way
    elif r.kind is RouteKind.BUNDLE:
        return f"route: in one bundle per node ({human(r.uplink)} in all)"
    else:
        return "route: nothing moves (every file is there with the same size and time)"
    return f"route: {text}" + (f"; {bundles}" if r.bundled else "")


def lines(p: Preview) -> list[str]:
    """The preview as `fleet plan` prints it."""
    files, size = sum(s.files for s in p.local), sum(s.bytes for s in p.local)
    parts = "; ".join(f"{s.label} {_count(s.files)}, {human(s.bytes)}" for s in p.local)
    head = f"data: {_count(files)}, {human(size)} to sync ({parts})"
    if p.nodes is None or p.route is None:
        return [f"{head}; what moves is known with --probe"]
    out = [head]
    for n in p.nodes:
        out.append(f"  {_node_line(n)}")
        out += [f"    {_dir_line(d, n.how)}" for d in n.dirs]
    if p.unknown_storage and len(p.nodes) > 1:
        out.append(f"  note: {', '.join(p.unknown_storage)}: no workdir there yet, so whether "
                   "nodes share storage is known after the first `fleet up` (each is counted "
                   "here as its own)")
    out.append(route_line(p.route))
    if p.route.chain or p.route.bundled:
        again = ", and as much again for each node it must feed directly" \
            if len(p.route.chain) > 1 else ""
        out.append(f"  this machine sends at most {human(p.route.uplink)}{again}")
    return out


def as_json(p: Preview) -> dict[str, object]:
    """The preview under `fleet plan --json`'s "data" key."""
    out: dict[str, object] = {
        "local": [{"dir": s.label, "files": s.files, "bytes": s.bytes} for s in p.local],
        "probed": p.nodes is not None, "nodes": None, "route": None}
    if p.nodes is None or p.route is None:
        return out
    out["nodes"] = [{
        "host": n.host, "how": n.how.value, "shares": n.shares, "why": n.why or None,
        "bytes_at_most": n.bytes if n.how is not How.SHARED else 0,
        "dirs": [{"dir": d.label, "present": d.present, "differ": len(d.differ),
                  "files": list(d.differ[:NAMES_MAX]), "bytes": d.bytes,
                  "partial": d.partial, "older": d.older, "unchanged": d.unchanged}
                 for d in n.dirs]} for n in p.nodes]
    out["route"] = {"kind": p.route.kind.value, "chain": list(p.route.chain),
                    "bundle": list(p.route.bundled), "uplink_bytes_at_most": p.route.uplink}
    out["unknown_storage"] = list(p.unknown_storage)
    return out


# ---- asking the nodes ---------------------------------------------------------------------------
def list_nodes(transports: Mapping[str, Transport],
               plan: Plan) -> dict[str, list[Manifest | None] | str]:
    """Each leader node's synced directories, listed read-only (one round trip each); where a
    node could not be listed, why."""
    dirs = synced(plan)

    def one(name: str) -> list[Manifest | None]:
        paths = [transports[name].path(p) for _, p in dirs[name]]
        r = transports[name].run(listing_script(paths), what="list the synced directories")
        return parse_listing(r.check(name).out, len(paths))

    results = each(((n, n) for n in dirs), one)
    return {n: reason(r) if isinstance(r, Exception) else r for n, r in results.items()}
