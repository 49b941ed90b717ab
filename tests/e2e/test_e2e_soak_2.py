"""The soak, part 2 of 3 (tests/e2e/soak.py): up / injected failure / stop / rm, again and
again on 3 hosts of its own, and nothing of any cycle left anywhere."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import CLI
from tests.e2e.soak import soak
from tests.testbed import Testbed


def test_soak_up_fail_stop_rm_leaves_nothing(cli: CLI, tb3: Testbed, tmp_path: Path) -> None:
    soak(cli, tb3, tmp_path)
