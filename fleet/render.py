"""Renders the per-node scripts from Jinja templates (shipped, or a job's own overrides)."""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import fleet.nodeside
import fleet.templates
from fleet.facts.leases import LEASE_DIR
from fleet.nodeside.shared import nodemap
from fleet.plan import SITE, NodePlan, Plan
from fleet.shell import MACHINE_ID, join, quote

if TYPE_CHECKING:
    import jinja2

# A source checkout's own templates/ (what its users read and edit, and what a git worktree
# changes) win over the copy an editable install maps to one checkout; installed, the package's.
_CHECKOUT = Path(fleet.nodeside.__file__).parent.parent.parent / "templates"
SHIPPED = (_CHECKOUT if (_CHECKOUT / "run.sh.j2").is_file()
           else Path(fleet.templates.__file__).parent)
NODESIDE = Path(fleet.nodeside.__file__).parent
SITE_FILES = ("sitecustomize.py", "fleet_local_rank.py")
# start.sh runs it beside the wrapper (the run's processes by descent). A file, not a
# here-document: a text longer than a pipe holds would keep the start's connection open until
# the program had read it.
TREE_FILE = "run_tree.py"
STOP_GRACE_S = 10
_LOADING = threading.Lock()


@dataclass(frozen=True)
class NodeFiles:
    """The rendered files for one node: name in the run directory -> (text, mode)."""

    files: dict[str, tuple[str, int]]


@functools.lru_cache(maxsize=8)
def environment(override: Path | None = None) -> jinja2.Environment:
    """One environment per templates directory for the process: each template is compiled once,
    not once per node (at 64 nodes that was most of the rendering's CPU); jinja still reloads
    a template whose file changed."""
    import jinja2  # loaded where a script is rendered: stop, status and logs need none

    loaders: list[jinja2.BaseLoader] = []
    if override is not None:
        loaders.append(jinja2.FileSystemLoader(str(override)))
    loaders.append(jinja2.FileSystemLoader(str(SHIPPED)))
    env = jinja2.Environment(loader=jinja2.ChoiceLoader(loaders), undefined=jinja2.StrictUndefined,
                             autoescape=False, keep_trailing_newline=True)
    env.filters["q"] = quote
    env.filters["shjoin"] = join
    return env


def render_node(plan: Plan, node: NodePlan, grace: int = STOP_GRACE_S) -> NodeFiles:
    env = environment(plan.job.templates)
    ctx = {"run_id": plan.run_id, "job": plan.job, "node": node, "grace": grace,
           "machine_id": MACHINE_ID, "run_pids": fleet.nodeside.text("run_pids.sh"),
           "map": nodemap,  # where things live on a node, and its variables' names
           # the node's run lease (a placement's), removed once the run's processes ended
           "run_lease": f"{LEASE_DIR}/{name}" if (name := plan.leases.get(node.host.name)) else ""}
    with _LOADING:  # every node's thread at once would each compile them: one does, once
        env_sh, run_sh, stop_sh = (env.get_template(f"{name}.j2")
                                   for name in ("env.sh", "run.sh", "stop.sh"))
    return NodeFiles({
        "env.sh": (env_sh.render(ctx), 0o600),
        "run.sh": (run_sh.render(ctx), 0o700),
        "stop.sh": (stop_sh.render(ctx), 0o700),
        **{f"{SITE}/{name}": (fleet.nodeside.text(name) + "\n", 0o644) for name in SITE_FILES},
        TREE_FILE: ((NODESIDE / TREE_FILE).read_text(), 0o644),
        nodemap.WATCHER: (fleet.nodeside.text(nodemap.WATCHER) + "\n", 0o644),
    })
