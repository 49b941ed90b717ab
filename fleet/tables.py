"""A table of rows as text: drawn by rich to fit a terminal's width (long cells wrap inside
their column, a row coloured by its style), or plain columns, one line a row, that scripts can
read. Every cell is made printable first: a node's words among them are data."""

from __future__ import annotations

import io
import re
from collections.abc import Sequence

from fleet.nodeside.shared.scrub import printable

_PADDING = re.compile(r" +((?:\x1b\[0m)?)$")


def draw(headers: Sequence[str], rows: Sequence[Sequence[str]], styles: Sequence[str | None],
         width: int | None, color: bool) -> str:
    """The table; `width` None: not a terminal (plain columns), else the terminal's columns."""
    cells = [[printable(c) for c in row] for row in rows]
    if width is None:
        widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
                         .rstrip() for row in [list(headers), *cells])
    from rich.console import Console as RichConsole
    from rich.table import Table
    from rich.text import Text

    t = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for i, h in enumerate(headers):
        t.add_column(h, overflow="fold", no_wrap=i < len(headers) - 1 and len(headers) > 1)
    for i, row in enumerate(cells):
        t.add_row(*(Text(c) for c in row), style=styles[i] if i < len(styles) else None)
    buf = io.StringIO()
    RichConsole(file=buf, width=width, force_terminal=color, no_color=not color,
                color_system="standard" if color else None, highlight=False, emoji=False,
                markup=False).print(t)
    # rich pads every row to the table's width: trailing blanks (inside a row's colour too)
    # only make copied text worse
    return "\n".join(_PADDING.sub(r"\1", line) for line in buf.getvalue().splitlines())
