"""What `fleet doctor` keeps of each host between looks, on this machine: per inventory file and
host, the last KEEP looks' figures (its links' median bandwidth, its disk), so that a host
that was fast and is slow now shows as a regression (`node4's link: 48 Mbit/s, was 9.4 Gbit/s
on 2026-11-20`), even where every host slowed together and no peer stands out. The file is
this machine's own record; one that cannot be read is started again, never trusted half."""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from pathlib import Path
from typing import Any

from fleet.config.doctor import Bounds
from fleet.doctor.figures import Examination, bits_words, bytes_words
from fleet.run.record import state_dir, write_atomic

KEEP = 20  # looks kept per host
MAX_BYTES = 4 << 20  # a history file past this is not read
# figure -> (its words, the bound's name in Bounds)
FIGURES = {"link": (bits_words, "link"), "disk write": (bytes_words, "disk"),
           "disk read": (bytes_words, "disk")}


def path_for(inventory: Path) -> Path:
    key = hashlib.sha256(str(inventory.resolve()).encode()).hexdigest()[:16]
    return state_dir().parent / "doctor" / f"{inventory.stem[:40]}-{key}.json"


def figures(exam: Examination) -> dict[str, dict[str, float]]:
    """Per host the figures kept: the median of its links' bandwidth, its disk's speeds."""
    out: dict[str, dict[str, float]] = {}
    for h, f in exam.hosts.items():
        mine = [x.bits for x in exam.links if h in (x.a, x.b) and x.bits is not None]
        got = {"link": statistics.median(mine) if mine else None,
               "disk write": f.disk_write, "disk read": f.disk_read}
        out[h] = {k: float(v) for k, v in got.items() if v}
    return out


def regressions(past: dict[str, list[dict[str, Any]]], now: dict[str, dict[str, float]],
                bounds: Bounds) -> list[str]:
    """A line per host figure now below its bound's share of the median of its looks kept,
    dated by the last look at or above that median (pure: `past` as load() gives it). The
    median, not the best look: a disk shared with other work measures 10x apart from one look
    to the next, and one fast look must not make every later one a regression."""
    lines = []
    for h, figs in now.items():
        for name, value in figs.items():
            words, bound = FIGURES[name]
            looks = [(float(look.get("at", 0)), then) for look in past.get(h, [])
                     if isinstance(then := look.get("figures", {}).get(name), int | float)]
            if not looks:
                continue
            usual = statistics.median(then for _, then in looks)
            if value < getattr(bounds, bound) * usual:
                at = max(when for when, then in looks if then >= usual)
                day = time.strftime("%Y-%m-%d", time.localtime(at))
                lines.append(f"{h}'s {name}: {words(value)}, was {words(usual)} on {day}")
    return lines


def load(path: Path) -> dict[str, list[dict[str, Any]]]:
    try:
        if path.stat().st_size > MAX_BYTES:
            return {}
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {h: [x for x in v if isinstance(x, dict)][-KEEP:] for h, v in data.items()
            if isinstance(v, list)}


def keep(path: Path, past: dict[str, list[dict[str, Any]]],
         now: dict[str, dict[str, float]], at: float) -> str:
    """This look added to each host's, the oldest dropped past KEEP; why it could not be kept
    ("" where it was: the look itself stands either way)."""
    merged = dict(past)
    for h, figs in now.items():
        merged[h] = [*merged.get(h, []), {"at": at, "figures": figs}][-KEEP:]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(merged) + "\n")
    except OSError as e:
        return f"this look is not kept for the next: {e}"
    return ""
