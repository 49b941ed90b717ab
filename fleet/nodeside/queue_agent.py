"""A host's queue agent: one per user and host, started by `fleet submit` / `fleet sweep`. It
holds a signed link to the queue's runner (fleet/nodeside/queue_runner.py), says which of this
host's GPUs are free (no process on them, no lease in the way), and starts only runs the laptop
staged here (runs/<run>/<host>/queue-start.sh), on the GPUs the runner named, under a run
lease taken for all of them at once (fleet/nodeside/lease.py: another user's lease or another
run's refuses it); when a run ends it gives the lease back and says how it ended. It ends once
the runner said goodbye (or is gone for ALONE_S) and nothing of its own runs. Its book keeps
what it waits on until the runner heard its end: the next agent here adopts it. Stdlib only.

argv: QUEUE_DIR HOST WORKDIR LEASE_DIR GPUS (the GPUs the queue may use here: "all" or
"0,2"; the runner's address is in QUEUE_DIR/runner.addr)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import select
import socket
import stat
import subprocess
import sys
import threading
import time
from typing import Any

from fleet.nodeside.shared.nodemap import EXIT_CODE, NODE_LOG, run_dir
from fleet.nodeside.shared.queue_files import parse_book, tail, write_json
from fleet.nodeside.shared.queue_link import QueueLink
from fleet.nodeside.shared.queue_rules import (
    FROM_RUNNER,
    BadWord,
    gpu_list,
    last_metrics,
    parse_smi,
    parse_spec,
    run_id,
)
from fleet.nodeside.shared.watch_link import part_ended

BEAT_S = 2.0  # how often the runner hears this host's GPUs
ALONE_S = 120.0  # no runner this long, nothing running here: the agent ends
LEASE_S = 7 * 86400  # a run lease's bound (given back when the run ends)
START = "queue-start.sh"  # the run's start, staged by the laptop in its directory here
CLEARED = ("exit_code", "exit_code.tmp", "started", "pid", "stopped", "locked", "machine")


class Agent:
    def __init__(self, qdir: str, host: str, workdir: str, lease_dir: str,
                 allowed: set[int] | None) -> None:
        self.qdir, self.host, self.workdir, self.lease_dir = qdir, host, workdir, lease_dir
        self.allowed = allowed
        self.gpus: tuple[int, ...] = ()  # as the last look saw them
        self.running: dict[str, tuple[int, ...]] = {}
        self.starting: set[str] = set()  # told to start, not yet started or refused
        self.ended_on: dict[str, tuple[int, ...]] = {}  # the GPUs of a run that ended
        self.ends: dict[str, dict[str, Any]] = {}  # said, not acknowledged yet
        self.leases: dict[str, str] = {}  # run -> its lease's file name
        self.refused: dict[int, tuple[float, str]] = {}  # GPU -> (until, why), from a refusal
        self.lock = threading.Lock()
        self.book = os.path.join(qdir, f"agent-{host}.runs.json")
        self.kept: dict[str, dict[str, Any]] = {}  # the book: run -> how to wait on it
        self.bye = False
        self.me = pwd.getpwuid(os.geteuid()).pw_name

    # ---- this host's GPUs -----------------------------------------------------------------
    def look(self) -> tuple[tuple[int, ...], list[int], dict[str, str], str]:
        """(every GPU, the free ones, why each other one is not, nvidia-smi's word: "ok",
        "none" where this host has no nvidia-smi (no GPU), "failed" where it did not answer:
        then nothing here is free, as what fleet cannot see it does not call free)."""
        try:
            g = _run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"])
            a = _run(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader"])
        except FileNotFoundError:
            self.gpus = ()
            return (), [], {}, "none"
        except (OSError, subprocess.SubprocessError, ValueError):
            return self.gpus, [], {}, "failed"
        gpus, by_uuid, apps = parse_smi(g, a)
        if self.allowed is not None:
            gpus = tuple(i for i in gpus if i in self.allowed)
        self.gpus = gpus
        now = time.time()
        with self.lock:
            ours = {x for gs in self.running.values() for x in gs}
            held = {str(i): why for i, (until, why) in self.refused.items() if until > now}
        for uuid, pid in apps:
            i = by_uuid.get(uuid)
            if i is not None and i not in ours:
                held.setdefault(str(i), f"process {pid} of {_owner(pid)}")
        free = [i for i in gpus if i not in ours and str(i) not in held]
        return gpus, free, held, "ok"

    # ---- runs -----------------------------------------------------------------------------
    def begin(self, link: QueueLink, run: str, gpus: tuple[int, ...]) -> None:
        """start(), in a thread of its own (the beats go on meanwhile), and its word."""
        try:
            why = self.start(run, gpus)
        except Exception as e:  # noqa: BLE001 - said to the runner, the agent goes on
            why = f"its start failed on {self.host}: {type(e).__name__}"
        finally:
            with self.lock:
                self.starting.discard(run)
        if why:
            link.send("refused", run=run, why="".join(c for c in why if c.isprintable())[:200])
        else:
            link.send("started", run=run, gpus=list(gpus), at=time.time())

    def start(self, run: str, gpus: tuple[int, ...]) -> str:
        """Start a staged run on these GPUs; "" once started, else why not."""
        d = run_dir(self.workdir, run, self.host)
        spec_path = os.path.join(self.qdir, "runs", f"{run}.json")
        try:
            with open(spec_path, encoding="utf-8") as f:
                spec = parse_spec(f.read(65536))
            st = os.lstat(os.path.join(d, START))
        except (OSError, ValueError) as e:
            return f"not staged on {self.host}: {e}"
        if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode):
            return f"its start on {self.host} is not this user's file"
        if spec.gpus and len(gpus) != spec.gpus:
            return "the runner named other GPUs than it needs"
        # The run's lease, all its GPUs at once (a whole-host run: the host), before anything
        said = self.lease("take", ",".join(map(str, gpus)) if spec.gpus else "all",
                          str(LEASE_S), f"fleet queue: {run}", f"{self.me}@{self.host}", run)
        if not said.get("ok"):
            why = _conflict(said)
            with self.lock:
                for g in gpus or self.gpus:
                    self.refused[g] = (time.time() + 30, why)
            return why
        self.leases[run] = str(said.get("name", ""))
        for name in CLEARED:  # an earlier attempt's, here
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(d, name))
        env = dict(os.environ)
        if gpus:
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        t0 = time.time()
        r = subprocess.run(["sh", START], cwd=d, env=env, capture_output=True, text=True,
                           timeout=60, check=False)
        words = r.stdout.split()
        if r.returncode != 0 or len(words) != 2 or not all(w.isdigit() for w in words):
            self.give(run)
            return f"its start failed on {self.host} (exit {r.returncode})"
        with self.lock:
            self.running[run] = gpus
        self.keep(run, {"gpus": list(gpus), "pid": int(words[0]), "start": int(words[1]),
                        "t0": t0, "lease": self.leases[run], "metrics": spec.metrics})
        threading.Thread(target=self.wait, args=(run, d, int(words[0]), int(words[1]), t0,
                                                 spec.metrics), daemon=True).start()
        return ""

    def keep(self, run: str, entry: dict[str, Any] | None) -> None:
        """The book: a run this agent waits on, or (None) one whose end the runner heard."""
        with self.lock:
            self.kept.pop(run, None) if entry is None else self.kept.update({run: entry})
            write_json(self.book, self.kept)

    def adopt(self) -> None:
        """The runs in the book of the agent before this one here (it died; they may live):
        waited on again, with their leases; one that ended meanwhile has its end said."""
        try:
            with open(self.book, encoding="utf-8") as f:
                book = parse_book(f.read(1 << 22))
        except OSError:
            return
        for run, e in book.items():
            with self.lock:
                self.running[run], self.leases[run] = tuple(e["gpus"]), e["lease"]
            self.keep(run, e)
            threading.Thread(target=self.wait, args=(
                run, run_dir(self.workdir, run, self.host), e["pid"], e["start"], e["t0"],
                e["metrics"]), daemon=True).start()

    def wait(self, run: str, d: str, pid: int, start: int, t0: float,
             metrics: dict[str, str]) -> None:
        """Until the run's wrapper ends (its lock let go, else looked at twice a second)."""
        with contextlib.suppress(OSError):
            fd = os.open(os.path.join(d, "lock"), os.O_RDONLY)
            if os.path.exists(os.path.join(d, "locked")):
                fcntl.flock(fd, fcntl.LOCK_SH)
            os.close(fd)
        while not (got := part_ended(d, pid, start))[0]:
            time.sleep(0.5)
        code = got[1]
        t1 = time.time()
        with contextlib.suppress(OSError):  # when its wrapper wrote it (an adopted run's end)
            t1 = min(t1, max(t0, os.stat(os.path.join(d, EXIT_CODE)).st_mtime))
        if code is None:
            with contextlib.suppress(OSError, ValueError), open(os.path.join(d, EXIT_CODE)) as f:
                code = int(f.read(8).strip())
        self.give(run)
        with self.lock:
            self.ended_on[run] = self.running.pop(run, ())
            self.ends[run] = {"run": run, "code": code, "started": t0, "ended": t1,
                              "stopped": os.path.exists(os.path.join(d, "stopped")),
                              "metrics": last_metrics(tail(os.path.join(d, NODE_LOG)), metrics)}

    def stop(self, run: str) -> None:
        """The run's own stop.sh (its processes, nothing else), in a thread of its own."""
        d = run_dir(self.workdir, run, self.host)
        if run in self.running and os.path.isfile(os.path.join(d, "stop.sh")):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["sh", os.path.join(d, "stop.sh"), "fleet sweep stop"],
                               input="\n", text=True, capture_output=True, timeout=60,
                               check=False)

    def lease(self, *args: str) -> dict[str, Any]:
        try:
            r = _run([sys.executable, "-I", "-S", os.path.join(self.qdir, "lease.py"),
                      self.lease_dir, *args])
            said = json.loads(r.strip().splitlines()[-1])
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            return {"ok": False, "error": "the lease program failed"}
        return said if isinstance(said, dict) else {"ok": False}

    def report(self) -> dict[str, Any]:
        """What a hello or a beat says: this host's GPUs, and the runs it has."""
        gpus, free, held, smi = self.look()
        with self.lock:  # a run that ended and whose end is not acknowledged yet is still here
            running = {r: list(g) for r, g in self.running.items()}
            running.update({r: list(self.ended_on.get(r, ())) for r in self.ends})
        return {"gpus": list(gpus), "free": free, "held": held, "running": running, "smi": smi}

    def tell(self, link: QueueLink, beat: float) -> float:
        """The ends not said yet, and a beat when due (returns the last beat's time): at once
        after an end, which frees its GPUs, so the runner need not wait for the next beat."""
        with self.lock:
            ends = list(self.ends.values())
        freed = False
        for end in ends:
            if not end.get("said"):
                link.send("ended", **{k: v for k, v in end.items() if k != "said"})
                end["said"] = freed = True
        if freed or time.time() - beat >= BEAT_S:
            link.send("beat", **self.report())
            return time.time()
        return beat

    def heard(self, link: QueueLink, kind: str, said: dict[str, Any]) -> None:
        if kind == "start":
            run = run_id(said["run"])
            gpus = gpu_list(said["gpus"], self.gpus)
            with self.lock:
                if run in self.running or run in self.starting:
                    return  # told twice: it is here already
                self.starting.add(run)
            threading.Thread(target=self.begin, args=(link, run, gpus), daemon=True).start()
        elif kind == "stop":
            threading.Thread(target=self.stop, args=(run_id(said["run"]),), daemon=True).start()
        elif kind == "ack":
            with self.lock:
                self.ends.pop(str(said["run"]), None)
                self.ended_on.pop(str(said["run"]), None)
            self.keep(str(said["run"]), None)
        elif kind == "bye":
            self.bye = True

    def give(self, run: str) -> None:
        name = self.leases.pop(run, "")
        if name:
            self.lease("drop", name)


def _conflict(said: dict[str, Any]) -> str:
    for c in said.get("conflicts") or []:
        if isinstance(c, dict):
            return f"a lease of {str(c.get('owner'))[:32]} until {c.get('until')}"[:200]
    return str(said.get("error") or "its lease was refused")[:200]


def _owner(pid: int) -> str:
    try:
        return pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name
    except (OSError, KeyError):
        return "another user"


def _run(argv: list[str]) -> str:
    """A command's output; ValueError where it failed (FileNotFoundError: not there)."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    if r.returncode != 0:
        raise ValueError(f"{argv[0]} exited {r.returncode}")
    return r.stdout


def connect(qdir: str, token: bytes) -> QueueLink | None:
    try:
        with open(os.path.join(qdir, "runner.addr"), encoding="ascii") as f:
            addr, port = f.read(200).split()
        sock = socket.create_connection((addr, int(port)), timeout=5)
    except (OSError, ValueError):
        return None
    return QueueLink(sock, token, FROM_RUNNER)


def main() -> None:
    qdir, host, workdir, lease_dir, given = sys.argv[1:6]
    # one a host (hosts that share a home share the queue's directory: a lock of its own each)
    one = os.open(os.path.join(qdir, f"agent-{host}.lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(one, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # this host's agent runs already
    with open(os.path.join(qdir, "key"), encoding="ascii") as f:
        token = f.read().strip().encode()
    allowed = None if given == "all" else {int(g) for g in given.split(",") if g.isdigit()}
    agent = Agent(qdir, host, workdir, lease_dir, allowed)
    agent.adopt()
    link, alone_since, beat = None, time.time(), 0.0
    while True:
        now = time.time()
        with agent.lock:
            busy = bool(agent.running or agent.starting)
        if link is None:
            if (agent.bye or now - alone_since > ALONE_S) and not busy:
                return
            link = connect(qdir, token)
            if link is None:
                time.sleep(1)
                continue
            link.send("hello", host=host, **agent.report())
            beat = now
        if agent.bye and not busy:
            return
        ready, _, _ = select.select([link.sock], [], [], 0.2)
        try:
            if ready:
                for kind, said in link.receive():
                    agent.heard(link, kind, said)
            beat = agent.tell(link, beat)
        except (OSError, BadWord, KeyError):
            link.close()
            link, alone_since = None, time.time()
            with agent.lock:
                for end in agent.ends.values():
                    end.pop("said", None)


if __name__ == "__main__":
    main()
