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
    out = t.run(ranktop.top_script(run_dir), timeout=LOOK_S, what="the ranks' sampling")
    top = ranktop.parse_top(out.check(t.host.name).out)
    return NodeLook(top, gpus.gpu_facts(t) if with_gpus and not top.missing else None)


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
            state = known.get(name) or run_state.state(
                t, run_dir, self.rec.stop_key(name)).outcome(name, n.node_rank)
            if state.status.is_terminal:
                state = outcomes.note(self.rec.dir, state, "fleet top")
            return state, look_one(t, run_dir, with_gpus)

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
