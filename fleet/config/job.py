"""The job file: what to run (script, args, env) and how to rendezvous."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import string
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

from fleet.config.doctor import take_before
from fleet.config.metrics import take_metrics
from fleet.config.notify import Notify, job_notify
from fleet.config.outputs import take_outputs
from fleet.config.placement import Placement, take_placement
from fleet.config.procs import Nproc, nproc_value
from fleet.config.restart import Restart, take_restart
from fleet.config.schema import PortSpec, Table, load_toml, take_forwards
from fleet.config.select import Selection
from fleet.config.watchdog import Watchdog as Watchdog  # its home was here
from fleet.config.watchdog import check_action, take_watchdog

JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
E = TypeVar("E", bound=StrEnum)


class Launcher(StrEnum):
    """What starts the job's processes on a node (both backends read it). Its value is the
    word the job file, the manifest and `fleet plan --json` spell it with."""

    TORCHRUN = "torchrun"  # python -m torch.distributed.run
    LEGACY = "legacy"  # python -m torch.distributed.launch (passes --local-rank to the script)
    ACCELERATE = "accelerate"  # `accelerate launch`
    # The job's own command line with placeholders, for scripts that spawn their own workers.
    COMMAND = "command"


class RendezvousBackend(StrEnum):
    """How torchrun's nodes meet: ranks in inventory order (static), or as they join (c10d)."""

    STATIC = "static"
    C10D = "c10d"


PLACEHOLDERS = ("node_rank", "nnodes", "nproc_per_node", "world_size", "first_rank",
                "master_addr", "master_port", "run_id", "code_dir", "data_dir", "host", "python")
# A word of `args` that stands for the command line's arguments: `fleet up JOB -- A B`.
ARGS_WORD = "{args}"
MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")
# How the legacy launcher passes the local rank: torch >= 2.0 says --local-rank; scripts written
# for older torch parse --local_rank only.
LOCAL_RANK_FLAGS = ("--local-rank", "--local_rank")


@dataclass(frozen=True)
class Rendezvous:
    backend: RendezvousBackend = RendezvousBackend.STATIC
    port: int = 29500
    timeout: int = 900  # seconds torchrun waits for all nodes to join


@dataclass(frozen=True)
class Job:
    path: Path
    name: str
    inventory: Path
    workdir: Path
    script: str | None  # a file in the workdir, or None with `module` or launcher = "command"
    args: tuple[str, ...] = ()
    # Where the command line's arguments (after `--`) go in args: the place of the job's
    # `{args}` word; None: after them all.
    args_at: int | None = None
    module: str | None = None  # run as `python -m module` (installed, or in the workdir)
    launcher: Launcher = Launcher.TORCHRUN
    command: tuple[str, ...] = ()  # launcher = "command": the argv, with {placeholders}
    nproc_per_node: Nproc = 1
    env: dict[str, str] = field(default_factory=dict)
    rendezvous: Rendezvous = Rendezvous()
    templates: Path | None = None  # a directory whose files override the shipped templates
    exclude: tuple[str, ...] = ()
    start_timeout: float = 120.0  # seconds to wait for the master's rendezvous port
    data: Path | None = None  # a local data directory synced to every node ($FLEET_DATA_DIR)
    secret_env: tuple[str, ...] = ()  # env names never printed (beside those that look secret)
    local_rank_flag: str = "--local-rank"  # launcher = "legacy": the flag the script parses
    launcher_args: tuple[str, ...] = ()  # options for the launcher itself, after fleet's own
    watchdog: Watchdog = Watchdog()
    debug: bool = False  # the usual distributed debugging env on every node (fleet up --debug)
    setup: str | None = None  # sh script run in the job's directory on each node, before start
    setup_inputs: tuple[str, ...] = ()  # files (in the workdir) whose content re-runs setup
    python: str | None = None  # the interpreter to run with, relative to the job's directory
    restart: Restart = Restart()
    doctor_before: str = ""  # `[doctor] before`: "quick" or "full" fleet doctor before up
    notify: Notify = Notify()  # word when the run ends (fleet.config.notify)
    # What `fleet pull` takes by default: paths under the job's directory on the nodes.
    outputs: tuple[str, ...] = ()
    forward: tuple[PortSpec, ...] = ()  # the master's ports reachable here while fleet is attached
    metrics: dict[str, str] = field(default_factory=dict)  # [metrics]: name -> pattern (fleet ui)
    # Real paths never synced, whatever name or link reaches them: the job file, where it
    # holds a [notify] (its webhook stays on this machine).
    unsent: tuple[str, ...] = ()
    selection: Selection = Selection()  # --node/--exclude: the inventory's hosts it runs on
    placement: Placement = Placement()  # `nodes`, `gpus_per_node`: part of the lab (placement.py)

    @property
    def slot(self) -> str:
        """The job's directory name on the nodes (code/<slot>): its name plus a digest of the
        job file's path, so that two job files never share one by accident (both `job.toml`,
        or the same `name`), while each run of one job file finds what the last one left."""
        return f"{self.name}-{_digest(self.path)}"

    @property
    def data_slot(self) -> str | None:
        """The data's directory name on the nodes: jobs that name one data directory share it."""
        return f"{self.data.name}-{_digest(self.data)}" if self.data else None


def _digest(path: Path) -> str:
    return hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]


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
            raise root.missing("inventory", "required key is missing (or pass -i INVENTORY)")
        inventory = here / inv_text
    workdir = here / root.take("workdir", str, ".")
    if not workdir.is_dir():
        raise root.error("workdir", f"directory not found: {workdir}")
    launcher = _one_of(root, "launcher", Launcher, Launcher.TORCHRUN)
    command: tuple[str, ...] = ()
    if launcher is Launcher.COMMAND:
        command = tuple(root.take_str_list("command"))
        if not command:
            raise root.error("command", "must not be empty")
        for i, word in enumerate(command):
            _check_placeholders(root, f"command[{i}]", word)
    script = root.take("script", str, None)
    module = root.take("module", str, None)
    if module is not None:
        if launcher is Launcher.COMMAND:
            raise root.error("module", 'not used with launcher = "command" (name it in command)')
        if script is not None:
            raise root.error("module", "give either script or module, not both")
        if not MODULE.match(module):
            raise root.error("module", f"{module!r} is not a python module name (pkg.mod)")
    elif script is None and launcher is not Launcher.COMMAND:
        raise root.missing("script", "required key is missing (or give module)")
    if script is not None:
        script_path = (workdir / script).resolve()
        if not script_path.is_file():
            raise root.error("script", f"file not found: {script_path}")
        if not script_path.is_relative_to(workdir.resolve()):
            raise root.error("script", f"{script!r} must lie inside the workdir {workdir}")
        script = script_path.relative_to(workdir.resolve()).as_posix()
    args, args_at = _args(root)
    launcher_args = tuple(root.take_str_list("launcher_args", []))
    if launcher_args and launcher is Launcher.COMMAND:
        raise root.error("launcher_args", 'not used with launcher = "command" (it has no '
                                          "launcher: put them in command)")
    local_rank_flag = root.take("local_rank_flag", str, "--local-rank")
    if local_rank_flag not in LOCAL_RANK_FLAGS:
        raise root.error("local_rank_flag", f"must be one of {', '.join(LOCAL_RANK_FLAGS)}, "
                                            f"not {local_rank_flag!r}")
    if root.has("local_rank_flag") and launcher is not Launcher.LEGACY:
        raise root.error("local_rank_flag", 'only used with launcher = "legacy" (torchrun '
                                            "passes LOCAL_RANK in the environment)")
    placement = take_placement(root)
    nproc: Nproc = _nproc(root)
    if placement.gpus_per_node is not None and not root.has("nproc_per_node"):
        nproc = placement.gpus_per_node  # one process a GPU, unless the job says otherwise
    if launcher in (Launcher.ACCELERATE, Launcher.COMMAND) and not isinstance(nproc, int):
        raise root.error("nproc_per_node", f"must be a number with launcher = "
                                           f"{launcher.value!r}")
    env = root.take_env("env")
    rdzv = _rendezvous(root.table("rendezvous"))
    watchdog_table = root.table("watchdog")
    watchdog = take_watchdog(watchdog_table)
    restart = take_restart(root.table("restart"), watchdog.hang_timeout)
    check_action(watchdog_table, watchdog, restart)
    doctor_before = take_before(root.table("doctor"))
    notify = job_notify(root)
    debug = root.take("debug", bool, False)
    setup = root.take("setup", str, None)
    if setup is not None and not setup.strip():
        raise root.error("setup", "must not be empty (leave it out for no setup)")
    setup_inputs = tuple(root.take_str_list("setup_inputs", []))
    if setup_inputs and setup is None:
        raise root.error("setup_inputs", "only used with setup")
    for i, rel in enumerate(setup_inputs):
        f = (workdir / rel).resolve()
        if not f.is_file():
            raise root.error(f"setup_inputs[{i}]", f"file not found: {f}")
        if not f.is_relative_to(workdir.resolve()):
            raise root.error(f"setup_inputs[{i}]", f"{rel!r} must lie inside the workdir "
                                                   f"{workdir} (it is synced with the code)")
    python = root.take("python", str, None)
    if python is not None and (not python.strip() or "\n" in python):
        raise root.error("python", "must be an interpreter's path (relative to the job's "
                                   "directory on the node, or absolute)")
    templates_text = root.take("templates", str, None)
    templates = here / templates_text if templates_text is not None else None
    if templates is not None and not templates.is_dir():
        raise root.error("templates", f"directory not found: {templates}")
    secret_env = tuple(root.take_str_list("secret_env", []))
    exclude = tuple(root.take_str_list("exclude", [])) + DEFAULT_EXCLUDE
    data_text = root.take("data", str, None)
    data = (here / data_text).resolve() if data_text is not None else None
    if data is not None:
        if not data.is_dir():
            raise root.error("data", f"directory not found: {data} (for MNIST, "
                                     f"`python jobs/make_mnist.py {data}` makes one)")
        if data.is_relative_to(workdir.resolve()):
            # Synced on its own; "/" anchors the pattern at the workdir's root.
            exclude += ("/" + data.relative_to(workdir.resolve()).as_posix(),)
    if restart.checkpoints:
        # The checkpoints live on the nodes, copied between them by fleet: a local folder of
        # that name is never sent over the newest copy a restart brought to a node.
        exclude += ("/" + restart.checkpoints,)
    # Not synced, by its real path (a link to it, or a name a pattern would read as a glob,
    # is no way round), as a .toml file that holds a [notify] is not (transport.ignore).
    unsent = (os.path.realpath(path),) if root.data.get("notify") else ()
    start_timeout = float(root.take("start_timeout", float, 120.0))
    if start_timeout <= 0:
        raise root.error("start_timeout", "must be positive")
    outputs = take_outputs(root)
    forward = take_forwards(root, "forward")
    metrics = take_metrics(root.table("metrics"))
    root.done()
    return Job(path=path, name=name, inventory=Path(inventory), workdir=workdir.resolve(),
               script=script, args=args, args_at=args_at, launcher=launcher, command=command,
               nproc_per_node=nproc, env=env, rendezvous=rdzv, templates=templates,
               exclude=exclude, start_timeout=start_timeout, data=data, secret_env=secret_env,
               module=module, local_rank_flag=local_rank_flag, launcher_args=launcher_args,
               watchdog=watchdog, restart=restart, debug=debug, setup=setup,
               setup_inputs=setup_inputs, python=python, notify=notify,
               outputs=outputs, forward=forward, unsent=unsent, doctor_before=doctor_before,
               metrics=metrics, placement=placement)


def with_extra_args(job: Job, extra: list[str]) -> Job:
    """The job with the command line's arguments (`fleet up JOB -- ...`) in the place of its
    `{args}` word, else after its args; taken literally (no placeholders)."""
    literal = tuple(a.replace("{", "{{").replace("}", "}}") for a in extra)
    at = len(job.args) if job.args_at is None else job.args_at
    return dataclasses.replace(job, args=job.args[:at] + literal + job.args[at:],
                               args_at=None if job.args_at is None else at + len(literal))


def _args(root: Table) -> tuple[tuple[str, ...], int | None]:
    """`args`, and where the `{args}` word stood in them (taken out: the command line's
    arguments go there, or nothing)."""
    args: list[str] = []
    at: int | None = None
    for i, word in enumerate(root.take_str_list("args", [])):
        if word != ARGS_WORD:
            _check_placeholders(root, f"args[{i}]", word)
            args.append(word)
        elif at is not None:
            raise root.error(f"args[{i}]", f"{ARGS_WORD} may stand once in args")
        else:
            at = len(args)
    return tuple(args), at


def _check_placeholders(root: Table, key: str, word: str) -> None:
    """Only known {placeholders}; `{{` and `}}` stand for literal braces."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(word) if f is not None]
    except ValueError as e:
        raise root.error(key, f"bad placeholder in {word!r}: {e} (write {{{{ for a brace)") from e
    for f in fields:
        if f == "args":
            raise root.error(key, f"{ARGS_WORD} stands for the words after `--` on the command "
                                  f"line: it is a word of its own in args, not part of {word!r}")
        if f not in PLACEHOLDERS:
            raise root.error(key, f"unknown placeholder {{{f}}} in {word!r} (known: "
                                  f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)})")


def _nproc(root: Table) -> Nproc:
    if not root.has("nproc_per_node"):
        root.take("nproc_per_node", int, 1)
        return 1
    return nproc_value(root, "nproc_per_node")


def _one_of(t: Table, key: str, kind: type[E], default: E) -> E:
    """A key whose value is one of an enum's words."""
    text = t.take(key, str, default.value)
    try:
        return kind(text)
    except ValueError:
        words = ", ".join(k.value for k in kind)
        raise t.error(key, f"must be one of {words}, not {text!r}") from None


def _rendezvous(t: Table) -> Rendezvous:
    backend = _one_of(t, "backend", RendezvousBackend, RendezvousBackend.STATIC)
    port = t.take("port", int, 29500)
    if not 0 < port < 65536:
        raise t.error("port", f"must be between 1 and 65535, not {port}")
    timeout = t.take("timeout", int, 900)
    if timeout < 1:
        raise t.error("timeout", "must be at least 1 second")
    t.done()
    return Rendezvous(backend=backend, port=port, timeout=timeout)
