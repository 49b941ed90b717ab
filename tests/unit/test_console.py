"""The console's tables and colours: plain columns off a terminal, rich's fitted table on one,
node text never obeyed and never read as markup."""

from __future__ import annotations

import io

import pytest

from fleet.console import Console, Meaning


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_table_is_aligned_columns_one_line_a_row() -> None:
    c = Console(out=io.StringIO(), err=io.StringIO())
    text = c.table(["HOST", "CHECK", "DETAIL"], [["node1", "ssh", "ok"],
                                                 ["n2", "sftp", "not \x1b[2J available"]])
    assert text.splitlines() == ["HOST   CHECK  DETAIL",
                                 "node1  ssh    ok",
                                 "n2     sftp   not ^[[2J available"]


def test_terminal_table_fits_the_width_and_colours_by_meaning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("COLUMNS", "60")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FLEET_PLAIN", raising=False)
    c = Console(out=Tty(), err=Tty())
    text = c.table(["HOST", "STATUS", "DETAIL"],
                   [["node1", "PASS", "word " * 40], ["node2", "FAIL", "[bold]x[/bold]"]],
                   [None, Meaning.FAIL])
    lines = text.splitlines()
    plain = [line.replace("\x1b[0m", "").replace("\x1b[1m", "").replace("\x1b[1;31m", "")
             for line in lines]
    assert len(lines) > 3 and all(len(p) <= 60 for p in plain)  # the detail wrapped, not cut
    assert sum(p.count("word") for p in plain) == 40
    assert "[bold]x[/bold]" in plain[-1]  # node text is never rich markup
    assert "\x1b[1;31m" in lines[-1] and not any(p.endswith(" ") for p in plain)


def test_no_color_and_pipes_get_no_escape(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    err = Tty()
    c = Console(out=Tty(), err=err)
    c.info("failed", Meaning.FAIL)
    assert err.getvalue() == "fleet: failed\n"
    monkeypatch.delenv("NO_COLOR")
    err = Tty()
    Console(out=Tty(), err=err).info("failed", Meaning.FAIL)
    assert err.getvalue() == "fleet: \x1b[1;31mfailed\x1b[0m\n"
    piped = io.StringIO()
    Console(out=io.StringIO(), err=piped).info("failed", Meaning.FAIL)
    assert piped.getvalue() == "fleet: failed\n"


def test_a_wait_is_silent_off_a_terminal_and_erased_on_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    piped = io.StringIO()
    c = Console(out=io.StringIO(), err=piped)
    with c.waiting("connecting 0/2") as w:
        w.update("connecting 1/2")
        c.info("node1 connected")
    assert piped.getvalue() == "fleet: node1 connected\n"
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.delenv("FLEET_PLAIN", raising=False)
    err = Tty()
    c = Console(out=io.StringIO(), err=err, color=False)
    with c.waiting("connecting 0/2") as w:
        w.update("connecting 1/2")
        c.info("node1 connected")
    text = err.getvalue()
    assert "connecting 1/2" in text and "fleet: node1 connected\n" in text
    assert text.endswith("\r\033[K")  # the spinner's line is erased once the wait is over


def test_a_drawn_table_reaches_the_terminal_with_its_colours(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`fleet check` prints its table through `emit`: its colours obeyed, a node's escape shown."""
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FLEET_PLAIN", raising=False)
    out = Tty()
    c = Console(out=out, err=Tty())
    c.emit(c.table(["HOST", "DETAIL"], [["node1", "evil \x1b[2J"]], [Meaning.FAIL]))
    text = out.getvalue()
    assert "\x1b[1;31m" in text and "^[" not in text.replace("^[[2J", "")
    assert "evil ^[[2J" in text and "\x1b[2J" not in text
