"""The rounds of `fleet doctor`'s link tests: in each round disjoint pairs, all run at once, so
that N hosts take about ceil(log2 N) + 1 rounds rather than N squared. Rounds 1..k pair host i
with i XOR 2^r (a hypercube; a partner past the last host sits the round out), then one round
pairs hosts that have not met yet, those with fewest peers first, so that every host meets
several others and a slow host shows as the common end of its slow pairs."""

from __future__ import annotations

from typing import TypeVar

Pair = tuple[int, int]
T = TypeVar("T")


def rounds(n: int) -> list[list[Pair]]:
    """The rounds for hosts 0..n-1: each a list of pairs (a < b), no host twice in a round, no
    pair twice in all."""
    if n < 2:
        return []
    k = (n - 1).bit_length()  # ceil(log2 n)
    out: list[list[Pair]] = []
    for r in range(k):
        out.append([(i, i ^ (1 << r)) for i in range(n) if i < i ^ (1 << r) < n])
    met: dict[int, set[int]] = {i: set() for i in range(n)}
    for pairs in out:
        for a, b in pairs:
            met[a].add(b)
            met[b].add(a)
    extra = more(met)
    if extra:
        out.append(extra)
    return out


def more(met: dict[int, set[int]]) -> list[Pair]:
    """One round of disjoint new pairs: hosts with the fewest peers first, each with the host
    not yet met that has the fewest peers itself."""
    taken: set[int] = set()
    pairs: list[Pair] = []
    for a in sorted(met, key=lambda i: (len(met[i]), i)):
        if a in taken:
            continue
        free = [b for b in met if b != a and b not in taken and b not in met[a]]
        if not free:
            continue
        b = min(free, key=lambda i: (len(met[i]), i))
        taken |= {a, b}
        pairs.append((min(a, b), max(a, b)))
    return sorted(pairs)


def disjoint(pairs: list[tuple[T, T]]) -> list[list[tuple[T, T]]]:
    """Pairs again (say, the slow ones, measured a second time) in as few rounds of disjoint
    pairs as a greedy pass finds, in their order."""
    out: list[list[tuple[T, T]]] = []
    for p in pairs:
        for r in out:
            if not {p[0], p[1]} & {x for q in r for x in q}:
                r.append(p)
                break
        else:
            out.append([p])
    return out
