"""Doctor: how long `fleet doctor --quick` takes against the number of hosts (the target: 30 s
at 8 hosts), its rounds of link tests beside the pairs that measuring every pair one at a time
would take, and what it named (nothing, on clean hosts)."""

from __future__ import annotations

import json
import os

from bench.common import Config, Scratch, Table, fmt, median, ratio, testbed, wait_idle

TIMEOUT = 600
TARGET_S = 30.0  # at 8 hosts (the target)


def one(sc: Scratch, n: int) -> tuple[float, dict[str, object], int]:
    p = sc.fleet("doctor", str(sc.inventory(n)), "--quick", "--json")
    code = p.wait(TIMEOUT)
    if code is None or p.ended is None:
        raise RuntimeError(f"fleet doctor at {n} hosts: no end in {TIMEOUT}s")
    try:
        out = json.loads(p.out_text())
    except ValueError as e:
        raise RuntimeError(f"fleet doctor at {n} hosts ({code}): {p.err_text()[-2000:]}") from e
    return p.ended - p.t0, out, code


def run(cfg: Config) -> list[Table]:
    counts, reps = cfg.pick((4, 8, 16, 32), (8,)), cfg.reps(3, 1)
    table = Table("doctor: `fleet doctor --quick` on N hosts (1 s of bytes a link, both ways, "
                  "pairs in rounds at once) against every pair one at a time (estimated: the "
                  "pairs times fleet's own time a round)",
                  ["hosts", "rounds", "links", "every pair", "fleet wall", "a round",
                   "one at a time (est.)", "fleet/one at a time", "named", "target"])
    with testbed(max(counts), cfg) as tb:
        sc = Scratch(tb, "doctor")
        for n in counts:
            walls, outs = [], []
            for _ in range(reps):
                wait_idle()
                wall, out, _ = one(sc, n)
                walls.append(wall)
                outs.append(out)
            w = median(walls) or 0.0
            rounds = int(outs[-1]["rounds"])  # type: ignore[call-overload]
            links = len(outs[-1]["links"])  # type: ignore[arg-type]
            pairs = n * (n - 1) // 2
            per_round = w / rounds if rounds else None
            serial = per_round * pairs if per_round else None
            named = sorted({h for o in outs for h in o["named"]})  # type: ignore[attr-defined]
            target = (f"<= {TARGET_S:.0f}s: {'met' if w <= TARGET_S else 'MISSED'}"
                      if n == 8 else "")
            if n == 8 and w > TARGET_S:
                table.problems.append(f"fleet doctor --quick took {w:.1f}s at 8 hosts")
            table.add(n, rounds, links, pairs, fmt(w), fmt(per_round), fmt(serial),
                      ratio(w, serial), ", ".join(named) or "none", target)
    table.notes.append(f"load average at the end: {os.getloadavg()[0]:.2f}; a round's time "
                       "includes the connection, probe and host measures, spread over the "
                       "rounds: the one-at-a-time estimate is generous to it")
    return [table]
