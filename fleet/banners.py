"""torchrun's own banners and warnings, recognised: the lines its agent prints on a node
before the job's first rank line (the OMP_NUM_THREADS block, c10d's words about the
client socket's hostname) are kept in the node's log but not shown on a terminal ahead of the
job's first line (fleet --debug, or the job's --debug, shows them). Pure.

What is recognised, only in a line torchrun itself printed (not a rank's: no `[defaultN]:`
prefix) and only before that node's first rank line:
- torchrun's Python warning about OMP_NUM_THREADS, in either of torch's log formats: glog's
  (`W1126 08:43:23.620000 1132 torch/distributed/run.py:982] ...`, each line of the block: the
  blank one, the `*****` rules and the `Setting OMP_NUM_THREADS ...` sentence) or logging's
  (`WARNING:torch.distributed.run:`, then the bare rules and sentence), or bare (a blank
  line, a rule, the sentence, a rule: torch's loggers without a handler of their own, as on a
  node where torchrun's stderr is a file); a blank line or a bare rule only at the log's start
  or after another line of the banner;
- c10d's warnings and notes, from C++ (`[W socket.cpp:601]`, `[W1122 02:09:24.909 socket.cpp:
  207]`, `[I ...]`), that say nothing about the job: `The hostname of the client socket cannot
  be retrieved`, `The IPv6 network addresses of (...) cannot be retrieved`, and `The client
  socket has connected to ...`.
An error line (`E...`) is never hidden, nor a failure to connect, nor anything else."""

from __future__ import annotations

import re

# glog's prefix, as torch's Python loggers write it: level, date, time, thread, file:line]
_GLOG = re.compile(r"^[IW]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ +(?P<src>\S+):\d+\] ?(?P<msg>.*)$")
# c10d's C++ prefix: [W socket.cpp:601] or [W1122 02:09:24.909136767 socket.cpp:207]
_CPP = re.compile(r"^\[[IW](?:\d{3,4} \d\d:\d\d:\d\d\.\d+)? ?(?P<src>\w+\.cpp):\d+\] "
                  r"(?P<msg>.*)$")
_RULE = re.compile(r"^\*{5,}\s*$")
_OMP = re.compile(r"^Setting OMP_NUM_THREADS environment variable for each process to be \S+ "
                  r"in default")
_C10D = re.compile(r"^\[c10d\] (The hostname of the client socket cannot be retrieved"
                   r"|The IPv6 network addresses of \(.*\) cannot be retrieved"
                   r"|The client socket has connected to )")
_RUN_PY = ("torch/distributed/run.py", "torch/distributed/launch.py")
_HEADER = ("WARNING:torch.distributed.run:", "WARNING:torch.distributed.launch:")
_RANKED = re.compile(r" [rl]\d+$")


def ranked(tag: str) -> bool:
    """Whether a terminal tag is a rank's (`node2 r3`, `node2 l0`), not torchrun's own
    (`node2`) nor the setup's (`node2 setup`)."""
    return bool(_RANKED.search(tag))


def noise(text: str, after_noise: bool = False) -> bool:
    """Whether a line of torchrun's own is one of its known banners or warnings.
    `after_noise`: the line before it was one, or it is the log's first (a blank line or a bare
    `*****` rule is torchrun's only then)."""
    line = text.rstrip("\r")
    m = _GLOG.match(line)
    if m:
        msg = m["msg"].strip()
        return m["src"].endswith(_RUN_PY) and (not msg or bool(_RULE.match(msg))
                                              or bool(_OMP.match(msg)))
    m = _CPP.match(line)
    if m:
        return bool(_C10D.match(m["msg"]))
    if line.strip() in _HEADER or _OMP.match(line):
        return True
    return after_noise and (not line.strip() or bool(_RULE.match(line)))


class Banner:
    """One node's lines on a terminal: torchrun's known banners and warnings hidden until the
    node's first rank line; from then on, every line shown."""

    def __init__(self) -> None:
        self.over = False
        self.hidden = 0
        self._after = True  # the log's start: its blank line and rule may open the banner

    def shown(self, tag: str, text: str) -> bool:
        if self.over:
            return True
        if ranked(tag):
            self.over = True
            return True
        if " " in tag:  # not torchrun's own (`node2`): the setup's (`node2 setup`), the job's
            return True
        self._after = noise(text, self._after)
        self.hidden += self._after
        return not self._after
