"""Words from a node made harmless before anyone reads them: `printable` (what reaches a
terminal: every control character shown instead of obeyed) and `masked` (what a notice or a
lease's note keeps: anything str.isprintable refuses as "?")."""

from __future__ import annotations


def _visible(code: int) -> str:
    """How a control character is shown: caret notation for C0 and DEL (as `cat -v` and less
    do: ESC is ^[), <U+XXXX> for the rest."""
    if code < 0x20:
        return "^" + chr(code + 0x40)
    if code == 0x7F:
        return "^?"
    return f"<U+{code:04X}>"


# What a terminal obeys rather than shows: C0 but tab (ESC starts every escape sequence, CR and
# BS overwrite what is on the line), DEL, C1 (CSI, OSC... in one byte), the line and paragraph
# separators, and the bidi controls that show text in another order than it is.
_CONTROLS = [*range(0x00, 0x09), *range(0x0A, 0x20), 0x7F, *range(0x80, 0xA0), 0x061C,
             0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_LINE = str.maketrans({c: _visible(c) for c in _CONTROLS})
_LINES = str.maketrans({c: _visible(c) for c in _CONTROLS if c != 0x0A})


def printable(text: str, lines: bool = False) -> str:
    """Text from a node (a log line, a traceback, a file name) as it may reach a terminal: every
    control character shown instead of obeyed (ESC as ^[, CR as ^M, U+202E as <U+202E>), the
    rest (UTF-8 text, tabs) unchanged. With `lines`, newlines stay line breaks."""
    return text.translate(_LINES if lines else _LINE)


def masked(text: object) -> str:
    """A node's or a server's words as one line: any printable character (Müller stays
    Müller), anything else (a control, a separator but the space) as "?"."""
    return "".join(c if c.isprintable() else "?" for c in str(text))
