"""What a node says is data: its text becomes a number here, by one rule, or not at all."""

from __future__ import annotations

MAX_DIGITS = 18  # past this a node's "number" is no count, pid, size or time fleet deals in


def number(text: str | None, limit: int | None = None, signed: bool = False) -> int | None:
    """A plain decimal number (ASCII digits only: `"²".isdigit()` is true, and int() of a few
    thousand digits raises), below `limit` where given; with `signed`, a leading "-" too.
    Anything else is None."""
    text = (text or "").strip()
    digits = text[1:] if signed and text.startswith("-") else text
    if not digits or len(digits) > MAX_DIGITS or not (digits.isascii() and digits.isdigit()):
        return None
    n = int(text)
    return n if limit is None or n < limit else None
