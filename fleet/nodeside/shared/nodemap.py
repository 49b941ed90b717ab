"""One map of a node: where fleet keeps things under a host's workdir (a job's code and data, a
run's directory and the files fleet and its node programs write there) and the variables every
process of a run finds in its environment. The laptop plans with it; node programs are bundled
with it (fleet.nodeside.bundle)."""

from __future__ import annotations

# Under a host's workdir
CODE = "code"  # code/<slot>: the job's directory, synced
DATA = "data"  # data/<data slot>: the job's data directory, synced ($FLEET_DATA_DIR)
RUNS = "runs"  # runs/<run id>/<node>: a run's directory on that node (Slurm: runs/<run id>)

# In a run directory
ENV_FILE = "env.sh"  # the run's environment, mode 0600, sourced by the launch script
SITE = "site"  # fleet's sitecustomize (and the legacy local-rank shim), on PYTHONPATH
NODE_LOG = "node.log"  # what the wrapper and the job print
NODE_TIMES = "node.times"  # node.log's time index (fleet/nodeside/log_times.py)
STARTED = "started"  # the wrapper's start (seconds since the epoch)
EXIT_CODE = "exit_code"  # the wrapper's exit code, once it has ended
STOPPED = "stopped"  # fleet's stop record (who stopped it, and a line fleet can prove)
RANKS = "ranks"  # ranks/<local rank>: its global rank, as each worker's sitecustomize wrote it
STACKS = "stacks"  # stacks/<pid>: a worker's stack, dumped on fleet's signal (fleet dump)
SAMPLES = "samples"  # samples/<pid>: where a worker spent its time lately (shared/sampling.py)
NOTIFY_JSON = "notify.json"  # a detached run's [notify], read once by its watcher
NOTIFY_LOG = "notify.log"  # what the watcher did
WATCHER = "watcher.py"  # the nodes' own watcher of a detached run (fail-fast without fleet)
WATCHER_CONFIG = "watcher.json"  # its config and keys, mode 0600, read once, then removed
WATCHER_PORT = "watcher.port"  # where the master's watcher listens (written by it)

# The variables fleet sets for every process of a run; a job cannot override them.
# The attempt's own id (a run with [restart] has one per attempt): how fleet finds and stops
# its processes (run_pids.sh).
ATTEMPT_ID_VAR = "FLEET_ATTEMPT_ID"
# The run's id, its first attempt's, the same on every attempt (what a tracker's run is named
# after); processes without FLEET_ATTEMPT_ID (started before fleet set it) are found by it.
RUN_ID_VAR = "FLEET_RUN_ID"
NODE_VAR = "FLEET_NODE"
NODE_RANK_VAR = "FLEET_NODE_RANK"
RUN_DIR_VAR = "FLEET_RUN_DIR"
# The job's data directory on this node, where the job has one (a job or host may set it).
DATA_DIR_VAR = "FLEET_DATA_DIR"
# "0" where the job turned the ranks' sampling off (`[watchdog] sampling = false`)
SAMPLING_VAR = "FLEET_SAMPLING"


def _root(workdir: str) -> str:
    return workdir.rstrip("/") or "/"


def _under(workdir: str, *parts: str) -> str:
    root = _root(workdir)
    return "/".join([root if root != "/" else "", *parts])


def code_dir(workdir: str, slot: str) -> str:
    """The job's code on a node."""
    return _under(workdir, CODE, slot)


def data_dir(workdir: str, slot: str | None) -> str | None:
    """The job's data on a node; None for a job without data."""
    return _under(workdir, DATA, slot) if slot else None


def runs_dir(workdir: str) -> str:
    """Where every run's directory is, on a node."""
    return _under(workdir, RUNS)


def run_dir(workdir: str, run_id: str, node: str | None = None) -> str:
    """A run's directory: one per node (nodes may share a workdir, an NFS home), or the run's
    own where `node` is None (Slurm: the nodes' directories are under it)."""
    return _under(workdir, RUNS, run_id, *([node] if node is not None else []))


def run_vars(attempt_id: str, run_id: str, node: str, rank: int, directory: str
             ) -> dict[str, str]:
    """What every process of a run finds in its environment, whatever the job says: its
    attempt's id and the run's (the same without restarts)."""
    return {RUN_ID_VAR: run_id, ATTEMPT_ID_VAR: attempt_id, NODE_VAR: node,
            NODE_RANK_VAR: str(rank),
            RUN_DIR_VAR: directory}
