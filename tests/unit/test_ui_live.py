"""fleet ui's lab looks (one thread, connections kept between looks and closed at the end, a
bad inventory said on its own row) and the run's events read from fleet's own JSON lines (what
is not one of fleet's objects never passed on)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from fleet.errors import ConfigError
from fleet.ui import live


class Survey:
    def __init__(self) -> None:
        self.looks = 0
        self.closed = False

    def look(self) -> dict[str, Any]:
        self.looks += 1
        return {"n1": "unreachable: timed out"}

    def close(self) -> None:
        self.closed = True


def test_the_lab_is_looked_at_with_connections_kept(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    survey = Survey()

    class Backend:
        def __init__(self, inv: Path) -> None:
            self.inv = inv

        def survey(self, inv: Path, nodes: object) -> Survey:
            if inv == bad:
                raise ConfigError(inv, "hosts", "must be a list")
            return survey

    monkeypatch.setattr("fleet.backends.for_inventory", Backend)
    monkeypatch.setattr(live, "LOOK_S", 0.05)
    lab = live.Lab([good, bad])
    try:
        first = lab.look()
        assert [i["path"] for i in first["inventories"]] == [str(good), str(bad)]
        assert first["inventories"][0]["hosts"] == {
            "hosts": [{"host": "n1", "error": "unreachable: timed out"}]}
        assert "hosts: must be a list" in first["inventories"][1]["error"]

        async def two() -> list[dict[str, Any]]:
            got = []
            stream = lab.stream()
            async for raw in stream:
                got.append(json.loads(raw.decode().split("data: ", 1)[1]))
                if len(got) == 2:
                    break
            await stream.aclose()
            return got

        seen = asyncio.run(asyncio.wait_for(two(), 30))
        assert all(s["inventories"][0]["hosts"]["hosts"][0]["host"] == "n1" for s in seen)
        assert survey.looks >= 2
    finally:
        lab.close()
    assert survey.closed and not lab._listeners


def test_only_fleets_own_events_are_passed_on(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    script = tmp_path / "fake_fleet.py"
    script.write_text(
        "import json, sys\n"
        "print(json.dumps({'v': 1, 'event': 'line', 'text': '<script>x</script>'}))\n"
        "print('event: end')\n"
        "print('[1, 2]')\n"
        "print(json.dumps({'v': 1, 'event': 'verdict', 'status': 'stopped'}))\n"
        "print('said on stderr', file=sys.stderr)\n"
        "sys.exit(4)\n")
    monkeypatch.setattr(live, "fleet_argv", lambda *a: [__import__("sys").executable,
                                                         str(script)])

    async def all_of() -> list[bytes]:
        return [raw async for raw in live.follow("r1")]

    got = [raw.decode() for raw in asyncio.run(asyncio.wait_for(all_of(), 30))]
    assert [g.split("\n")[0] for g in got] == ["event: fleet", "event: fleet", "event: end"]
    assert json.loads(got[0].split("data: ")[1])["text"] == "<script>x</script>"
    assert json.loads(got[2].split("data: ")[1]) == {"exit_code": 4,
                                                       "words": "said on stderr\n"}


def test_an_action_is_bounded_and_says_its_words(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    import sys

    monkeypatch.setattr(live, "fleet_argv", lambda *a: [sys.executable, "-c", *a])
    done = asyncio.run(live.act(["import sys; print('stopped'); sys.exit(3)"], tmp_path))
    assert done == {"ok": False, "exit_code": 3, "words": "stopped\n"}
    monkeypatch.setattr(live, "ACTION_S", 0.5)
    slow = asyncio.run(live.act(["import time; time.sleep(30)"], tmp_path))
    assert slow["ok"] is False and "did not end within 0.5s" in slow["words"]
