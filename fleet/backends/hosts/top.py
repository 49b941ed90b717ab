"""What every rank of a run did lately, asked of its nodes (fleet.facts.ranktop, one command a
node over connections kept open between looks), and their GPUs where nvidia-smi is there: what
`fleet top` draws and the straggler watch of `fleet up` judges."""

from __future__ import annotations

from fleet.backends.answers import NodeLook
from fleet.facts import gpus, ranktop, run_state
from fleet.run import outcomes
from fleet.run.record import RunRecord
from fleet.states import NodeOutcome
from fleet.transport import Transport, open_transport
from fleet.transport.group import each
from fleet.waits import named, over

LOOK_S = 10  # one node's answer, at most


def look(nodes: dict[str, tuple[Transport, str]], with_gpus: bool = False
         ) -> dict[str, NodeLook | Exception]:
    """Per node (name -> (its open transport, its run directory)) its ranks' sampling, and
    its GPUs where asked; a node's failure is its answer."""

    def one(pair: tuple[Transport, str]) -> NodeLook:
        return look_one(*pair, with_gpus)

    with over("every rank's sampling", nodes) as wait:
        return each(named(nodes.items()), wait.tracked(one))


def look_one(t: Transport, run_dir: str, with_gpus: bool) -> NodeLook:
    return one_look(t, run_dir, with_gpus, "")[1]


TOP, GPUS = "=== fleet-top", "=== fleet-gpus"  # where each part's answer begins


def one_look(t: Transport, run_dir: str, with_gpus: bool, key: str | None
             ) -> tuple[run_state.NodeState | None, NodeLook]:
    """One round trip: the node's state (where `key`, its stop key, is given), its ranks'
    sampling, and its GPUs where asked; each part in a subshell of its own (one that ends early
    ends only itself). A marker line cannot come from the run directory's files: the state's
    lines each begin with their field's name, and the sampling's file lines with `|`."""
    parts = [f"( {run_state.state_script(run_dir)}\n)"] if key is not None else []
    parts += [f"echo '{TOP}'", f"( {ranktop.top_script(run_dir)}\n)"]
    if with_gpus:
        parts += [f"echo '{GPUS}'", f"( {gpus.GPU_SCRIPT}\n)"]
    out = t.run("\n".join(parts), timeout=LOOK_S, what="the ranks' sampling").check(
        t.host.name).out
    state_text, _, rest = out.partition(f"\n{TOP}\n") if key is not None else ("", "", out)
    if key is None:
        rest = rest.partition(f"{TOP}\n")[2]
    top_text, _, gpu_text = rest.partition(f"\n{GPUS}\n")
    state = run_state.parse_state(state_text, key) if key is not None else None
    top = ranktop.parse_top(top_text)
    return state, NodeLook(top, gpus.parse_gpus(gpu_text) if with_gpus and gpu_text else None)


class RecordTop:
    """A recorded run's ranks, looked at again and again over connections opened once (a node
    that could not be reached is tried afresh at the next look); each node's state as `fleet
    status` says it (an end fleet kept stands; one seen now is kept)."""

    def __init__(self, rec: RunRecord) -> None:
        self.rec = rec
        self.open: dict[str, Transport] = {}

    def _connect(self, names: list[str]) -> dict[str, Exception]:
        hosts = {n.host.name: n.host for n in self.rec.nodes if n.host.name in names}
        with over("connect", hosts) as wait:
            got = each(named(hosts.items()), wait.tracked(open_transport))
        self.open.update({h: t for h, t in got.items() if isinstance(t, Transport)})
        return {h: e for h, e in got.items() if isinstance(e, Exception)}

    def look(self, with_gpus: bool = False
             ) -> tuple[dict[str, NodeOutcome | Exception], dict[str, NodeLook | Exception]]:
        """(per node its state, per node its ranks' look), in node rank order."""
        names = [n.host.name for n in self.rec.nodes]
        failed: dict[str, Exception] = self._connect([h for h in names if h not in self.open])
        known = outcomes.ended(self.rec.dir)
        dirs = {n.host.name: n for n in self.rec.nodes}

        def one(pair: tuple[Transport, str]) -> tuple[NodeOutcome, NodeLook]:
            t, name = pair
            n = dirs[name]
            run_dir = t.path(n.run_dir)
            asked, seen = one_look(t, run_dir, with_gpus, self.rec.stop_key(name))
            assert asked is not None
            state = known.get(name) or asked.outcome(name, n.node_rank)
            if state.status.is_terminal:
                state = outcomes.note(self.rec.dir, state, "fleet top")
            return state, seen

        with over(f"the ranks of {self.rec.run_id}", self.open) as wait:
            asked = each(named((h, (t, h)) for h, t in self.open.items()), wait.tracked(one))
        states: dict[str, NodeOutcome | Exception] = {}
        looks: dict[str, NodeLook | Exception] = {}
        for name in names:
            r = failed.get(name) or asked.get(name)
            if isinstance(r, tuple):
                states[name], looks[name] = r
            else:
                err = r if isinstance(r, Exception) else RuntimeError("not asked")
                states[name] = looks[name] = err
                self.drop(name)
        return states, looks

    def drop(self, name: str) -> None:
        t = self.open.pop(name, None)
        if t is not None:
            t.close()

    def close(self) -> None:
        for name in list(self.open):
            self.drop(name)
