"""What a lab's GPUs look like to a person and to a script: `fleet gpus`'s table and JSON, the
blockers that keep a job off a host (`fleet up --wait`, leases), and the words for a lease. Pure:
it reads GpuFacts (fleet.facts.gpus), and this machine's clock only through `now` arguments."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from fleet.console import Meaning
from fleet.facts.gpus import GpuApp, GpuFacts, others, owner
from fleet.facts.leases import Lease

IDLE_AFTER_S = 3600.0  # a process holding GPU memory this long with the GPU at 0% is flagged
IDLE_MIN_MIB = 256  # less than this is a CUDA context, not a model someone forgot


def span(seconds: float) -> str:
    """An age or a time left, to a person's precision: `40 s`, `12 min`, `3 h 5 min`, `14 h`,
    `2 d`."""
    s = max(round(seconds), 0)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 36000:  # 1 h 59 min is not "1 h"
        return f"{s // 3600} h" + (f" {s % 3600 // 60} min" if s % 3600 >= 60 else "")
    if s < 86400 * 2:
        return f"{s // 3600} h"
    return f"{s // 86400} d"


def size(mib: int) -> str:
    return f"{mib / 1024:.0f} GiB" if mib >= 1024 else f"{mib} MiB"


def local_until(lease: Lease, facts_now: float, now: float) -> float:
    """When a lease ends on this machine's clock: its time left on the host's clock, from now
    (so a host whose clock is off still ends it at the right moment here)."""
    return now + (lease.until - facts_now) if facts_now else lease.until


def clock(when: float, now: float) -> str:
    """`17:30` today, `Wed 09:00` within a week, else `2026-12-24 09:00` (local time)."""
    t, today = time.localtime(when), time.localtime(now)
    if t[:3] == today[:3]:
        return time.strftime("%H:%M", t)
    return time.strftime("%a %H:%M" if abs(when - now) < 6 * 86400 else "%Y-%m-%d %H:%M", t)


def lease_words(lease: Lease, facts_now: float, now: float) -> str:
    """`alice until 17:30 (3 h left): "paper deadline"`; a run lease's `alice for run RUN until
    ...`."""
    end = local_until(lease, facts_now, now)
    note = f': "{lease.note}"' if lease.note else ""
    run = f" for run {lease.run}" if lease.run else ""
    return f"{lease.owner}{run} until {clock(end, now)} ({span(end - now)} left){note}"


def idle(app: GpuApp, util: int | None) -> bool:
    """Memory held by a process running IDLE_AFTER_S or more, its GPU at 0% at this look: maybe
    forgotten, maybe between epochs (one sample: `fleet gpus --watch` says how long it has seen
    0% itself)."""
    return (util == 0 and app.used_mib >= IDLE_MIN_MIB and app.age_s is not None
            and app.age_s >= IDLE_AFTER_S)


def holder(app: GpuApp) -> str:
    """`18 GiB, alice, 3 h` (pid and command follow where a person needs them)."""
    who = app.user or f"pid {app.pid} (not visible here)"
    age = f", {span(app.age_s)}" if app.age_s is not None else ""
    return f"{size(app.used_mib)}, {who}{age}"


@dataclass(frozen=True)
class Blocker:
    """What keeps a job off a host now: a process on a GPU it would use, or another user's
    lease; `gpu` None for a whole-host lease."""

    host: str
    gpu: int | None
    text: str
    what: str = ""  # which process or lease it is: the same blocker, however old it grows

    def line(self) -> str:
        return f"{self.host} GPU{self.gpu}: {self.text}" if self.gpu is not None else \
            f"{self.host}: {self.where()}{self.text}"

    def where(self) -> str:
        """What a blocker without a GPU is on, where it needs saying: a lease of the host."""
        return "the whole host: " if self.gpu is None and self.what.startswith("lease") else ""


def wanted(chosen: tuple[int, ...] | None, facts: GpuFacts) -> tuple[int, ...] | None:
    """The GPUs a job would use on a host: those chosen in the inventory, else every one there
    (None where the host has none: leases then apply to the whole host)."""
    if chosen:
        return chosen
    return tuple(g.index for g in facts.gpus) or None


def lease_blockers(host: str, chosen: tuple[int, ...] | None, facts: GpuFacts,
                   now: float) -> list[Blocker]:
    """Other users' active leases on what the job would use (no GPU chosen: the whole host), and
    anyone's run leases (the GPUs of a run that runs); leases not all read are in the way of all
    of it (one unread may be a colleague's)."""
    gpus = chosen or None
    out = []
    if facts.unknown:
        out.append(Blocker(host, None, f"its leases are unknown: {facts.unknown}",
                           "lease unknown"))
    for lease in facts.active_leases():
        if (lease.owner == facts.me and not lease.run) or not lease.overlaps(gpus):
            continue
        words = f"leased by {lease_words(lease, facts.now, now)}"
        where = [g for g in (lease.gpus or ()) if gpus is None or g in gpus]
        key = f"lease {lease.owner} {lease.since} {lease.until}"
        out += [Blocker(host, g, words, key) for g in where] or [Blocker(host, None, words, key)]
    return out


def process_blockers(host: str, chosen: tuple[int, ...] | None, facts: GpuFacts,
                     now: float) -> list[Blocker]:
    """Other users' processes (and processes this node cannot see) on the GPUs the job would
    use: what plain `fleet up` refuses unless --force. The login's own never block it."""
    return [Blocker(host, g.index, f"{a.used_mib} MiB in use by {owner(a)} (pid {a.pid})",
                    f"pid {a.pid}") for g, a in others(wanted(chosen, facts) or (), facts)]


def blockers(host: str, chosen: tuple[int, ...] | None, facts: GpuFacts, now: float,
             leases: bool = True) -> list[Blocker]:
    """Everything between a job and this host: anyone's process on a GPU it would use, and
    (with `leases`) other users' leases."""
    gpus = wanted(chosen, facts) or ()
    out = []
    if facts.smi and (facts.error or (chosen and not facts.gpus)):
        # What it cannot see it cannot call free.
        out.append(Blocker(host, None, f"nvidia-smi failed: {facts.error or 'no GPU listed'}",
                           "nvidia-smi"))
    for g in gpus:
        out += [Blocker(host, g, holder(a), f"pid {a.pid}") for a in facts.on(g)]
        unseen = unlisted(facts, g)
        if unseen >= IDLE_MIN_MIB:
            out.append(Blocker(host, g, f"{size(unseen)} held by processes nvidia-smi does not "
                                        "list (another container's?)", "unlisted"))
    return out + (lease_blockers(host, chosen, facts, now) if leases else [])


def unlisted(facts: GpuFacts, index: int) -> int:
    """MiB in use on GPU `index` beyond what its listed processes hold."""
    g = next((g for g in facts.gpus if g.index == index), None)
    return 0 if g is None else g.used_mib - sum(a.used_mib for a in facts.on(index))


# ---- fleet gpus --------------------------------------------------------------------------------
HEADERS = ("HOST", "GPU", "MEMORY", "UTIL", "USER", "PID", "AGE", "COMMAND", "NOTE")


def rows(results: dict[str, GpuFacts | str], now: float, watched: dict[str, float] | None = None,
         ) -> tuple[list[list[str]], list[Meaning | None]]:
    """The table: per host its GPUs, each with its processes (one row each) and leases; a host
    that could not be asked (the text why), has no nvidia-smi or a failing one is one row.
    `watched`: per "host/gpu" since when (this machine's clock) --watch has seen it held at
    0%."""
    out: list[list[str]] = []
    meanings: list[Meaning | None] = []

    def add(row: list[str], meaning: Meaning | None = None) -> None:
        out.append(row + [""] * (len(HEADERS) - len(row)))
        meanings.append(meaning)

    for host, f in results.items():
        if isinstance(f, str):
            add([host, "-", "", "", "", "", "", "", f"not asked: {f}"], Meaning.FAIL)
            continue
        listed = {g.index for g in f.gpus}
        if f.unknown:
            add([host, "all", "", "", "", "", "", "", f"leases unknown: {f.unknown}"],
                Meaning.WARN)
        for lease in f.active_leases():  # of the host, or of GPUs nvidia-smi did not list
            if lease.gpus is None or not set(lease.gpus) <= listed:
                add([host, "all" if lease.gpus is None else ",".join(map(str, lease.gpus)),
                     "", "", "", "", "", "", f"leased by {lease_words(lease, f.now, now)}"],
                    Meaning.WARN)
        if not f.smi:
            add([host, "-", "", "", "", "", "", "", "no nvidia-smi here (no NVIDIA GPU)"],
                Meaning.NOTE)
            continue
        if f.error or not f.gpus:  # the GPUs it did list follow
            add([host, "-", "", "", "", "", "", "",
                 f"nvidia-smi failed: {f.error or 'it lists no GPU'}"], Meaning.FAIL)
        for g in f.gpus:
            util = f"{g.util}%" if g.util is not None else "n/a"
            head = [host, str(g.index), f"{g.used_mib / 1024:.1f}/{g.total_mib / 1024:.1f} GiB",
                    util]
            leases = [lease for lease in f.active_leases() if lease.gpus is not None
                      and g.index in lease.gpus]
            notes = [f"leased by {lease_words(lease, f.now, now)}" for lease in leases]
            if (unseen := unlisted(f, g.index)) >= IDLE_MIN_MIB:
                notes.append(f"{size(unseen)} held by processes nvidia-smi does not list")
            apps = f.on(g.index)
            if not apps:
                add(head + ["", "", "", "", "; ".join(notes) or "free"],
                    Meaning.WARN if notes else Meaning.OK)
            for k, a in enumerate(apps):
                note = [f"run {a.run_id}"] if a.run_id else []
                if idle(a, g.util):
                    since = (watched or {}).get(f"{host}/{g.index}")
                    seen = f", 0% for the {span(now - since)} watched" \
                        if since is not None and now - since >= 1 else ""
                    note.append(f"idle? 0% now{seen}")
                add((head if k == 0 else ["", "", "", ""]) + [
                    a.user or "?", str(a.pid), span(a.age_s) if a.age_s is not None else "?",
                    a.command or "(not visible here)", "; ".join(note + notes)],
                    Meaning.WARN if idle(a, g.util) else None)
    return out, meanings


def as_json(results: dict[str, GpuFacts | str], now: float) -> dict[str, Any]:
    """`fleet gpus --json`: per host its GPUs, processes and active leases (end times on this
    machine's clock, as seconds since the epoch), or why it could not be asked."""
    hosts: list[dict[str, Any]] = []
    for host, f in results.items():
        if isinstance(f, str):
            hosts.append({"host": host, "error": f})
            continue

        def lease(x: Lease, f: GpuFacts = f) -> dict[str, Any]:
            return {"owner": x.owner, "gpus": list(x.gpus) if x.gpus is not None else None,
                    "until": round(local_until(x, f.now, now), 1), "note": x.note,
                    "run": x.run or None}

        hosts.append({
            "host": host, "error": f.error or None, "nvidia_smi": f.smi, "user": f.me,
            "leases": [lease(x) for x in f.active_leases()],
            "leases_unknown": f.unknown or None,
            "gpus": [{"index": g.index, "name": g.name, "uuid": g.uuid,
                      "memory_used_mib": g.used_mib, "memory_total_mib": g.total_mib,
                      "utilization": g.util,
                      "processes": [{"pid": a.pid, "user": a.user or None,
                                     "memory_mib": a.used_mib, "age_s": a.age_s,
                                     "command": a.command or None, "run": a.run_id or None,
                                     "idle": idle(a, g.util)} for a in f.on(g.index)]}
                     for g in f.gpus]})
    return {"hosts": hosts}
