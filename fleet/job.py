"""The job file: what to run (script, args, env) and how to rendezvous."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from fleet.schema import Table, load_toml

JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
BACKENDS = ("static", "c10d")
NPROC_WORDS = ("gpu", "cpu", "auto")


@dataclass(frozen=True)
class Rendezvous:
    backend: str = "static"
    port: int = 29500
    timeout: int = 900  # seconds torchrun waits for all nodes to join


@dataclass(frozen=True)
class Job:
    path: Path
    name: str
    inventory: Path
    workdir: Path
    script: str
    args: tuple[str, ...] = ()
    nproc_per_node: int | str = 1
    env: dict[str, str] = field(default_factory=dict)
    rendezvous: Rendezvous = Rendezvous()
    templates: Path | None = None  # a directory whose files override the shipped templates
    exclude: tuple[str, ...] = ()
    start_timeout: float = 120.0  # seconds to wait for the master's rendezvous port
    data: Path | None = None  # a local data directory synced to every node ($FLEET_DATA_DIR)


DEFAULT_EXCLUDE = (".git", "__pycache__", ".fleet", ".venv", "*.pyc", ".mypy_cache",
                   ".pytest_cache")


def load_job(path: Path, inventory: Path | None = None) -> Job:
    """Read and check a job file; relative paths in it are relative to the file itself."""
    path = Path(path)
    root = Table(path, load_toml(path, "job"))
    here = path.resolve().parent
    name = root.take("name", str, path.stem)
    if not JOB_NAME.match(name):
        raise root.error("name", f"{name!r} is not a valid job name "
                                 "(letters, digits, '.', '_', '-')")
    inv_text = root.take("inventory", str, None)
    if inventory is None:
        if inv_text is None:
            raise root.error("inventory", "required key is missing (or pass -i INVENTORY)")
        inventory = here / inv_text
    workdir = here / root.take("workdir", str, ".")
    if not workdir.is_dir():
        raise root.error("workdir", f"directory not found: {workdir}")
    script = root.take("script", str)
    script_path = (workdir / script).resolve()
    if not script_path.is_file():
        raise root.error("script", f"file not found: {script_path}")
    if not script_path.is_relative_to(workdir.resolve()):
        raise root.error("script", f"{script!r} must lie inside the workdir {workdir}")
    args = tuple(root.take_str_list("args", []))
    nproc = _nproc(root)
    env = root.take_env("env")
    rdzv = _rendezvous(root.table("rendezvous"))
    templates_text = root.take("templates", str, None)
    templates = here / templates_text if templates_text is not None else None
    if templates is not None and not templates.is_dir():
        raise root.error("templates", f"directory not found: {templates}")
    exclude = tuple(root.take_str_list("exclude", [])) + DEFAULT_EXCLUDE
    data_text = root.take("data", str, None)
    data = (here / data_text).resolve() if data_text is not None else None
    if data is not None:
        if not data.is_dir():
            raise root.error("data", f"directory not found: {data} (for MNIST, "
                                     "`python jobs/make_mnist.py` makes one)")
        if data.is_relative_to(workdir.resolve()):
            # Synced on its own; "/" anchors the pattern at the workdir's root.
            exclude += ("/" + data.relative_to(workdir.resolve()).as_posix(),)
    start_timeout = float(root.take("start_timeout", float, 120.0))
    if start_timeout <= 0:
        raise root.error("start_timeout", "must be positive")
    root.done()
    return Job(path=path, name=name, inventory=Path(inventory), workdir=workdir.resolve(),
               script=script_path.relative_to(workdir.resolve()).as_posix(), args=args,
               nproc_per_node=nproc, env=env, rendezvous=rdzv, templates=templates,
               exclude=exclude, start_timeout=start_timeout, data=data)


def _nproc(root: Table) -> int | str:
    if not root.has("nproc_per_node"):
        root.take("nproc_per_node", int, 1)
        return 1
    value = root.data["nproc_per_node"]
    if isinstance(value, str):
        value = root.take("nproc_per_node", str)
        if value not in NPROC_WORDS:
            raise root.error("nproc_per_node", f'must be a positive integer or one of '
                                               f'{", ".join(NPROC_WORDS)}, not {value!r}')
        return value
    n = root.take("nproc_per_node", int)
    if n < 1:
        raise root.error("nproc_per_node", f"must be at least 1, not {n}")
    return n


def _rendezvous(t: Table) -> Rendezvous:
    backend = t.take("backend", str, "static")
    if backend not in BACKENDS:
        raise t.error("backend", f"must be one of {', '.join(BACKENDS)}, not {backend!r}")
    port = t.take("port", int, 29500)
    if not 0 < port < 65536:
        raise t.error("port", f"must be between 1 and 65535, not {port}")
    timeout = t.take("timeout", int, 900)
    if timeout < 1:
        raise t.error("timeout", "must be at least 1 second")
    t.done()
    return Rendezvous(backend=backend, port=port, timeout=timeout)
