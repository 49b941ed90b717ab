"""The straggler of a synchronous job, from every rank's sampling (fleet.facts.ranktop): pure.

At each collective every rank waits for the slowest one, so the others' share of time in
collectives is how much the straggler makes them wait, and the straggler itself hardly waits.
A rank's score is how much longer it computes per step than the others do:
(1 - its wait share) / (1 - the median of the others' wait shares). A rank whose score is at
least the factor (default 1.3; `[watchdog] straggler`) is the straggler, where the others also
lose a share of their time to it worth naming (MIN_GAP): where steps are mostly communication,
the compute shares are small and their ratio says little (a loaded machine's noise alone makes
it 1.5), while a rank that costs the others under a tenth of their time costs the job little."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from fleet.facts.ranktop import NodeTop, RankSample
from fleet.nodeside.shared.sampling import COLLECTIVE, SAMPLE_HZ
from fleet.run.record import NodeRecord

FACTOR = 1.3  # the default: a rank that computes 1.3x as long per step as the others
MIN_SAMPLES = int(6 * SAMPLE_HZ)  # samples a rank needs before it is judged (about 6 s)
MIN_GAP = 0.15  # the others wait this much more of their time than it does, at least
SCORE_MAX = 99.0  # the others wait all the time: said as this
THROTTLED = 0.05  # a cgroup throttled in more of its periods than this is said to be throttled
PERSIST = 3  # a watch names a rank named this many looks in a row


@dataclass(frozen=True)
class Straggler:
    rank: int
    host: str
    score: float
    others_wait: float  # the median share of the others' time in collectives
    place: str  # where the others wait most (`all_reduce()`)
    throttled: float | None  # the share of its host cgroup's CPU periods throttled
    line: str  # `rank 5 (node3) is the straggler: ...`


@dataclass(frozen=True)
class Standing:
    """Every rank's score, and the straggler (None: no rank is, `why` says why where it is not
    for want of one)."""

    scores: dict[int, float]
    straggler: Straggler | None
    why: str = ""

    def verdict(self) -> str:
        """`fleet top`'s last line."""
        if self.straggler is not None:
            return f"straggler: {self.straggler.line}"
        return "straggler: none" + (f" ({self.why})" if self.why else "")


def spans(nodes: Iterable[NodeRecord]) -> dict[str, range]:
    """The global ranks the plan gave each node, where it knows them (a static rendezvous)."""
    return {n.host.name: range(n.rank_base, n.rank_base + n.nproc) for n in nodes
            if n.rank_base is not None and n.nproc is not None}


def ranks_of(nodes: dict[str, NodeTop], planned: dict[str, range] | None = None
             ) -> dict[int, tuple[str, RankSample]]:
    """Per global rank, its host and its process's summary. A node's word is data: a rank
    outside the ranks the plan gave that node (`planned`, where the plan knows them) is left
    out, and so is a rank two nodes claim alive (the job or a node says what no launcher made);
    an ended process's summary never outweighs a live one's."""
    seen: dict[int, list[tuple[str, RankSample]]] = {}
    for host, top in nodes.items():
        allowed = (planned or {}).get(host)
        for rank, s in top.ranks().items():
            if allowed is None or rank in allowed:
                seen.setdefault(rank, []).append((host, s))
    out: dict[int, tuple[str, RankSample]] = {}
    for rank, found in sorted(seen.items()):
        alive = [f for f in found if f[1].alive]
        if len(alive if alive else found) == 1:
            out[rank] = (alive or found)[0]
    return out


def judge(ranks: dict[int, tuple[str, RankSample]], factor: float = FACTOR) -> Standing:
    """The standing of the ranks: each alive, in the process group, with enough samples."""
    judged = {r: (h, s) for r, (h, s) in ranks.items()
              if s.alive and s.joined and s.samples >= MIN_SAMPLES}
    if len(judged) < 2:
        alive = [s for _, s in ranks.values() if s.alive]
        why = ("no rank sampled" if not ranks else "no rank runs" if not alive else
               "too few samples yet" if any(s.samples < MIN_SAMPLES for s in alive) else
               "fewer than two ranks in a process group")
        return Standing({}, None, why)
    shares = {r: s.collective / s.samples for r, (_, s) in judged.items()}
    scores: dict[int, float] = {}
    for r, w in shares.items():
        others = statistics.median(v for o, v in shares.items() if o != r)
        scores[r] = SCORE_MAX if others >= 1.0 else min((1.0 - w) / (1.0 - others), SCORE_MAX)
    worst = max(scores, key=lambda r: (scores[r], -r))
    others_wait = statistics.median(v for o, v in shares.items() if o != worst)
    if scores[worst] < factor or others_wait - shares[worst] < MIN_GAP:
        return Standing(scores, None)
    host, sample = judged[worst]
    place = _where_others_wait({r: s for r, (_, s) in judged.items() if r != worst})
    line = (f"rank {worst} ({host}) is the straggler: the others wait for it in {place} "
            f"{others_wait:.0%} of the time (it waits {shares[worst]:.0%}: "
            f"{scores[worst]:.2f}x their compute per step)")
    if sample.throttled is not None and sample.throttled >= THROTTLED:
        line += f"; {host} CPU throttled {sample.throttled:.0%} of the time"
    return Standing(scores, Straggler(worst, host, round(scores[worst], 2), others_wait, place,
                                      sample.throttled, line))


def _where_others_wait(others: dict[int, RankSample]) -> str:
    counts: dict[str, int] = {}
    for s in others.values():
        for p in s.places:
            if p.kind == COLLECTIVE:
                counts[p.where] = counts.get(p.where, 0) + p.count
    return max(counts, key=lambda w: (counts[w], w)) if counts else "collectives"


class Watch:
    """Looks in a row: a rank is named once it is the straggler PERSIST looks running, and
    then only once (until another rank is)."""

    def __init__(self, persist: int = PERSIST) -> None:
        self.persist = persist
        self.run: tuple[int, str] | None = None
        self.count = 0
        self.named: tuple[int, str] | None = None

    def look(self, standing: Standing) -> Straggler | None:
        s = standing.straggler
        who = (s.rank, s.host) if s is not None else None
        self.count = self.count + 1 if who is not None and who == self.run else 1
        self.run = who
        if s is None or who == self.named or self.count < self.persist:
            return None
        self.named = who
        return s
