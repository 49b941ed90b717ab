"""Start: CPU seconds of every kind of start fleet has (`--version`, `--help` of the app and of a
command, a shell completion, `ps` and `status` with no run recorded, `up` of a missing job file),
against python importing typer and rich (what any typer CLI pays first), each against the target
of 0.3 s."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from bench.common import FLEET_PATH, PY, Config, Proc, Table, fmt, median, ratio, wait_idle

TARGET_S = 0.3  # every command's start: the interpreter, imports and parsing
BASELINE = [PY, "-c", "import typer, rich"]
COMPLETE = {"_FLEET_COMPLETE": "complete_bash"}
# (what, fleet's arguments, environment, whether the target applies: a command's start alone;
# `up` of a missing file also loads what `up` needs to run, before it reads the file)
CASES = [
    ("fleet --version", ["--version"], {}, True),
    ("fleet --help", ["--help"], {}, True),
    ("fleet up --help", ["up", "--help"], {}, True),
    ("completion `fleet st<TAB>`", [], {**COMPLETE, "COMP_WORDS": "fleet st", "COMP_CWORD": "1"},
     True),
    ("completion `fleet status <TAB>` (run ids)", [],
     {**COMPLETE, "COMP_WORDS": "fleet status ", "COMP_CWORD": "2"}, True),
    ("fleet ps (no run recorded)", ["ps"], {}, True),
    ("fleet status (no run recorded: exit 3)", ["status"], {}, True),
    ("fleet up missing.toml (exit 2)", ["up", "missing.toml"], {}, False),
]
# typer's own floor: an app of 20 empty commands (its help draws with rich; its parsing builds
# pydantic adapters), the same requests
TYPER_APP = '''import typer
app = typer.Typer()
for i in range(20):
    def f(x: str = "a", y: bool = False) -> None:
        """Do a thing."""
    app.command(f"cmd{i}")(f)
app(prog_name="app")
'''


def bare_args(args: list[str]) -> list[str] | None:
    """What the bare typer app is asked for the same request (None: nothing comparable)."""
    if args == ["--help"] or not args:
        return args
    if args[1:] == ["--help"]:
        return ["cmd1", "--help"]
    if args in (["ps"], ["status"]):
        return ["cmd1"]
    return None


def cpu(argv: list[str], env: dict[str, str], cwd: Path) -> float | None:
    p = Proc(argv, env=env, cwd=cwd)
    return p.cpu_s if p.wait(60) is not None else None


def run(cfg: Config) -> list[Table]:
    reps = cfg.reps(9, 5)
    table = Table("start: CPU seconds (user + system) of a command that connects to nothing, "
                  "against python importing typer and rich",
                  ["command", "fleet CPU", "typer+rich import", "fleet/baseline",
                   "a bare typer app", "fleet/typer app", f"<= {TARGET_S}s"])
    with tempfile.TemporaryDirectory(prefix="fleet-bench-start-") as d:
        tmp = Path(d)
        (tmp / "app.py").write_text(TYPER_APP)
        env = {**os.environ, "FLEET_STATE_DIR": str(tmp / "state"), "NO_COLOR": "1",
               "COLUMNS": "80", "PYTHONPATH": str(FLEET_PATH[0])}
        for what, args, extra, targeted in CASES:
            fl: list[float] = []
            base: list[float] = []
            bare: list[float] = []
            app_env = {**env, **{k.replace("_FLEET_", "_APP_"): v.replace("fleet", "app")
                                 for k, v in extra.items()}}
            app_args = bare_args(args)
            for _ in range(reps):  # interleaved: a busy moment weighs on all three alike
                wait_idle(2)
                for into, argv, e in ((fl, [PY, "-m", "fleet", *args], {**env, **extra}),
                                      (base, BASELINE, env),
                                      (bare, [PY, "app.py", *(app_args or [])], app_env)):
                    if (into is not bare or app_args is not None) and \
                            (s := cpu(argv, e, tmp)) is not None:
                        into.append(s)
            f, b, t = median(fl), median(base), median(bare)
            verdict = ("met" if f is not None and f <= TARGET_S else "MISSED") if targeted \
                else "-"
            table.add(what, fmt(f), fmt(b), ratio(f, b), fmt(t) if bare else "-",
                      ratio(f, t) if bare else "-", verdict)
    table.notes.append(f"median of {reps} runs each, interleaved; CPU: ru_utime + ru_stime from "
                       "wait4; fleet byte-compiled (bench.run's copy). A bare typer app: 20 "
                       "empty commands, asked the same (for `ps` and `status`: one of its "
                       "commands), which is what typer itself costs: its help draws with rich "
                       "(Markdown and pygments loaded), its parsing builds pydantic adapters")
    return [table]
