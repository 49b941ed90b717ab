"""node.log's time index, node.times, kept beside it while the run's wrapper lives: each time the
log has grown by whole lines, a line `<bytes> <time>` saying that its first <bytes> bytes (always
a line's end) were written by <time> (this node's clock, seconds since the epoch), within TICK_S
of it. `fleet logs --merge` and `--since` read it (fleet/nodeside/log_view.sh); node.log itself
stays as the job printed it. It ends once the wrapper has ended and the log's last lines are
stamped. argv: the run directory, the wrapper's pid."""

import os
import sys
import time

from fleet.nodeside.shared.nodemap import NODE_LOG, NODE_TIMES
from fleet.nodeside.shared.run_end import ended

TICK_S = 0.05
CHUNK = 1 << 20  # read at most this much at a time: a large log never sits in memory whole


def main() -> None:
    run_dir, pid = sys.argv[1], int(sys.argv[2])
    done = 0  # bytes of whole lines stamped
    seen = 0  # bytes read (a line still being written may follow `done`)
    stamped = 0
    with open(os.path.join(run_dir, NODE_LOG), "rb") as log, \
            open(os.path.join(run_dir, NODE_TIMES), "a", encoding="ascii") as out:
        while True:
            last = ended(run_dir, pid)  # asked before reading: what came before the end is read
            log.seek(seen)
            while True:
                chunk = log.read(CHUNK)
                if not chunk:
                    break
                at = chunk.rfind(b"\n")
                if at >= 0:
                    done = seen + at + 1
                seen += len(chunk)
            if done != stamped:
                out.write(f"{done} {time.time():.3f}\n")
                out.flush()
                stamped = done
            if last:
                return
            time.sleep(TICK_S)


if __name__ == "__main__":
    main()
