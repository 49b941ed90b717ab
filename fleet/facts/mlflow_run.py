"""The MLflow run a tracked run writes to, created on the master (fleet/nodeside/mlflow_run.py):
the command, and a pure parser that takes nothing from the node but a well-formed run id."""

from __future__ import annotations

from fleet.console import printable
from fleet.nodeside import python_program
from fleet.nodeside.shared import nodemap
from fleet.shell import AND, Raw, home_word, sh
from fleet.trackers import MLFLOW_ID

MARK = "fleet-mlflow"
TAIL_LINES = 5  # of the output, where it says no run id


class NoRun(Exception):  # noqa: N818 - a parse result, not one of fleet's errors
    """Why no MLflow run came back (the words for the master's row)."""


def command(code_dir: str, run_dir: str, python: str, run_id: str) -> str:
    """Create the run: in the job's directory, with the job's env (env.sh) and its python."""
    return " ".join([sh("cd", code_dir, AND, Raw("."), f"{run_dir}/{nodemap.ENV_FILE}", AND),
                     python_program(home_word(python), "mlflow_run.py", run_id,
                                    redirect="2>&1")])


def parse(out: str, exit_code: int, python: str) -> str:
    """The new run's id (32 hex digits, as MLflow makes them); NoRun saying why not: mlflow
    missing for the job's python, or the program's failure (its last lines)."""
    lines = out.splitlines()
    marks = [line.split(" ", 2)[1:] for line in lines if line.startswith(MARK + " ")]
    if marks and marks[-1][0] == "missing":
        why = printable(marks[-1][1] if len(marks[-1]) > 1 else "")[:200]
        raise NoRun(f'[restart] tracker = "mlflow", but the job\'s python ({python}) cannot '
                    f"import mlflow ({why}): install it there (`pip install mlflow-skinny`, "
                    "say in the job's setup)")
    if exit_code == 0 and marks and marks[-1][0] == "run" and len(marks[-1]) == 2 \
            and MLFLOW_ID.match(marks[-1][1]):
        return marks[-1][1]
    tail = " | ".join(printable(line)[:200] for line in lines[-TAIL_LINES:]) or "no output"
    raise NoRun(f"creating the MLflow run failed (exit {exit_code}): {tail}")
