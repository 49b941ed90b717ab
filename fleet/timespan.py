"""Durations as a person types them on the command line (30s, 10m, 1.5h, 2d)."""

from __future__ import annotations

import re

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def parse_duration(text: str) -> float | None:
    """Seconds, or None where `text` is not a number with one of the units s, m, h, d."""
    m = _DURATION.fullmatch(text.strip())
    return float(m.group(1)) * UNITS[m.group(2)] if m else None
