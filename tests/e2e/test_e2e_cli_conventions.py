"""`fleet trust` taking a job file, against real hosts: the unknown-key advice names the user's
own file (job or inventory), and `fleet trust FILE --accept` records exactly those keys."""

from __future__ import annotations

from pathlib import Path

from fleet.errors import ExitCode
from tests.conftest import _need_testbed
from tests.testbed import Testbed
from tests.unit.test_cli_conventions import fleet


def test_unknown_key_advice_names_the_job_file_and_trust_takes_it(tmp_path: Path) -> None:
    _need_testbed()
    with Testbed(2) as tb:
        known = tmp_path / "known_hosts"
        known.write_text("")
        inv = tb.inventory(tmp_path / "lab.toml", known_hosts=str(known))
        (tmp_path / "train.py").write_text("print('hi')\n")
        (tmp_path / "job.toml").write_text('inventory = "lab.toml"\nscript = "train.py"\n')
        for args, named in [(["plan", "--probe", "job.toml"], "job.toml"),
                            (["plan", "--probe", "job.toml", "-i", str(inv)], str(inv)),
                            (["ps", "--hosts", "lab.toml"], "lab.toml")]:
            r = fleet(*args, cwd=tmp_path)
            assert r.returncode == ExitCode.UNREACHABLE, r
            assert "unknown host key" in r.stderr and "INVENTORY" not in r.stderr, r
            assert f"record it with `fleet trust {named} --accept`" in r.stderr, r
        shown = fleet("trust", "job.toml", cwd=tmp_path)
        assert shown.returncode == 1 and shown.stdout.count(" NEW ") == 2, shown
        accepted = fleet("trust", "job.toml", "--accept", cwd=tmp_path)
        assert accepted.returncode == 0, accepted
        assert accepted.stdout.endswith(f"recorded 2 key(s) in {known}\n"), accepted
        again = fleet("trust", "job.toml", cwd=tmp_path)
        assert again.returncode == 0 and again.stdout.count(" KNOWN ") == 2, again
        assert fleet("plan", "--probe", "job.toml", cwd=tmp_path).returncode == 0
