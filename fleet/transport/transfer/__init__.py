"""Moving large files to nodes: streamed, verified, only what changed, each byte once over this
machine's uplink.

The engine is fleet.nodeside.ferry (its docstring has the stream's format; `agent` runs it on a
node); this package is this machine's side of it, in four steps:

1. What each node lacks (`plan.need`, pure): from its listing, the files whose size or time
   differ; of those it holds (the file, or a partial one an interrupted transfer left), the
   blocks whose hashes differ, from one `ferry hash` on the node (`plan.parse_held`) and the same
   hashes here (`push.local_file`). A file whose content is already there (a `touch`) only gets
   its time set.
2. The route (`plan.chains`, pure): the nodes in one chain, this machine sending to the first and
   each node passing the stream on to the next over TCP (they reach each other for torch
   anyway), pipelined, so that N nodes take about as long as one. A link that cannot be made
   splits the chain there: the node after it is fed from here, and the console says so.
3. The stream (`relay.Transfer`): every file once, read here in blocks, hashed as it is read,
   sent to the head of every chain, its progress shown (`progress.Bar`). Nothing is held whole
   in memory.
4. The reports (`report.parse_report`, pure; read by `receiver.Receiver`): every node says what
   it placed, what it verified (sha256 of what it assembled, compared with this machine's), and
   what failed, which ends in one HostError naming the host, the path and what to do.

`push.move` drives the four for many nodes, `push.sync_dir` for one directory to one node, and
`pull.fetch` brings a node's files here. The rest of fleet takes what it needs from here.
"""

from __future__ import annotations

from fleet.transport.transfer.plan import BUNDLE_MAX, Dir, Held, Local, Move, Moved, Need, streams
from fleet.transport.transfer.pull import fetch
from fleet.transport.transfer.push import move, sync_dir
from fleet.transport.transfer.relay import Outcome, Target
from fleet.transport.transfer.report import human

__all__ = ["BUNDLE_MAX", "Dir", "Held", "Local", "Move", "Moved", "Need", "Outcome", "Target",
           "fetch", "human", "move", "streams", "sync_dir"]
