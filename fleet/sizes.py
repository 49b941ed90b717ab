"""Sizes as a person reads them (`300 MiB`, not `314572800 bytes`), and what was sent to many
nodes said once per copy (`300 MiB sent to 3 nodes`, not the sum). Pure."""

from __future__ import annotations


def human(n: int) -> str:
    """Bytes in binary units: `512 bytes`, `1.5 KiB`, `300.0 MiB`."""
    if n < 1024:
        return f"{n} bytes"
    x, units = float(n) / 1024, ["KiB", "MiB", "GiB", "TiB"]
    while x >= 1024 and len(units) > 1:
        x /= 1024
        units.pop(0)
    return f"{x:.1f} {units[0]}"


def short(n: int) -> str:
    """Like `human`, without a `.0` that says nothing: `300 MiB`, `1.5 GiB`."""
    return human(n).replace(".0 ", " ")


def sent_to(label: str, sizes: dict[str, int]) -> str | None:
    """What was sent of `label` (code, data) to several nodes, once: the same size everywhere
    is one copy sent to N nodes; different sizes, the most one node got and how many. None
    for one node (its own line says it) or nothing sent."""
    got = [s for s in sizes.values() if s > 0]
    if len(sizes) < 2 or not got:
        return None
    if len(got) == len(sizes) and len(set(got)) == 1:
        return f"{label}: {short(got[0])} sent to {len(got)} nodes"
    return f"{label}: up to {short(max(got))} sent to each of {len(got)} of {len(sizes)} nodes"
