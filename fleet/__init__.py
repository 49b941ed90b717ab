"""fleet: run one PyTorch distributed job across a handful of SSH hosts.

Where fleet is the program (the `fleet` command, `python -m fleet`: the package is loaded while
`sys.argv[0]` is still `-m`), a Ctrl-C or TERM from here until the CLI's one handler takes
signals ends fleet as any interruption does: one line, exit 130, no traceback. Never where a
test or another program imports fleet."""

# `_signal` (built into Python) and `os`, `sys` (loaded with Python itself) take no time to
# import: `signal` would, and a Ctrl-C during its import would be a traceback.
import _signal
import os as _os
import sys as _sys

__version__ = "0.1.0"


def _early(signum: int, frame: object) -> None:
    """Nothing has started yet: the word and the exit code are those of any interruption."""
    name = "SIGINT" if signum == _signal.SIGINT else "SIGTERM"
    _sys.stderr.write(f"fleet: interrupted ({name})\n")
    _os._exit(130)


if _sys.argv and (_sys.argv[0] == "-m" or _os.path.basename(_sys.argv[0]) == "fleet"):
    for _sig in (_signal.SIGINT, _signal.SIGTERM):
        _signal.signal(_sig, _early)
