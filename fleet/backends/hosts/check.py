"""`fleet check`: per host and check, pass / warn / fail with the fix, before anything runs."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.backends.hosts.node import connect_script
from fleet.config.inventory import Host, Inventory
from fleet.config.job import DEFAULT_EXCLUDE, Job
from fleet.errors import FleetError
from fleet.facts.gpus import GpuFacts, absent, busy, gpu_facts
from fleet.facts.probe import Facts, master_address, net_for, probe, storage_groups
from fleet.nodedata import number
from fleet.plan import NodeNet, node_nproc
from fleet.run import faults
from fleet.shell import sh
from fleet.transport import SSHTransport, Transport, open_transport
from fleet.transport.group import each, reason

PASS, WARN, FAIL = "pass", "warn", "fail"
CLOCK_SKEW_WARN_S = 2.0
DISK_WARN_BYTES = 10 << 30
DISK_FAIL_BYTES = 1 << 30
REVERSE_DNS_WARN_S = 1.0
LISTEN_S = 20  # a check listener lives at most this long on a node
LISTENER_MARK = "fleet-preflight-listener"  # in its command line: how stop_listener knows it

# Runs on each node with its python: versions, GPUs, name resolution, clock, disk. Prints JSON.
_FACTS = r'''
import json, os, shutil, socket, subprocess, sys, time
out = {"python": sys.version.split()[0]}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda_available"] = torch.cuda.is_available()
    out["gpus"] = torch.cuda.device_count() if out["cuda_available"] else 0
    out["cuda"] = torch.version.cuda or ""
    try:
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if out["gpus"] else ""
    except Exception:
        out["nccl"] = ""
except Exception as e:
    out["torch_error"] = f"{type(e).__name__}: {e}"
try:
    import torchvision
    out["torchvision"] = torchvision.__version__
except Exception:
    out["torchvision"] = ""
if shutil.which("nvidia-smi"):
    q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True, timeout=20)
    out["driver"] = q.stdout.strip().splitlines()[0] if q.stdout.strip() else ""
    q = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                        "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
    out["gpu_processes"] = [l for l in q.stdout.strip().splitlines() if l.strip()]
name = socket.gethostname()
out["hostname"] = name
try:
    out["hostname_resolves"] = sorted({a[4][0] for a in socket.getaddrinfo(name, None)})
except OSError as e:
    out["hostname_resolves"] = []
    out["hostname_error"] = str(e)
own = sys.argv[2]
t0 = time.monotonic()
try:
    socket.gethostbyaddr(own)
except OSError:
    pass
out["reverse_dns_s"] = time.monotonic() - t0
path = os.path.expanduser(sys.argv[1])
while not os.path.exists(path):
    path = os.path.dirname(path) or "/"
out["disk_free"] = shutil.disk_usage(path).free
out["disk_path"] = path
out["time"] = time.time()  # last, so that it meets fleet's clock as the answer arrives
print(json.dumps(out), flush=True)
os._exit(0)  # now: an interpreter that imported torch takes a second to tear down
'''

# Listens on a port and says whether it could; accepts (and closes) the expected number of
# connections, then exits, or gives up after a while: the port is free again for the job.
_LISTEN = r'''
import os, socket, sys, time
port = int(sys.argv[1])
try:
    # IPv4 and IPv6 on one socket where the node has both: nodes may reach it either way.
    if socket.has_dualstack_ipv6():
        s = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True,
                                 backlog=64)
    else:
        s = socket.create_server(("", port), backlog=64)
except OSError as e:
    print(f"busy {e}", flush=True)
    sys.exit(0)
print(f"listening {s.getsockname()[1]} {os.getpid()}", flush=True)
s.settimeout(0.5)
end = time.monotonic() + float(sys.argv[2])
left = int(sys.argv[3])
while left > 0 and time.monotonic() < end:
    try:
        s.accept()[0].close()
        left -= 1
    except OSError:
        pass
'''


@dataclass(frozen=True)
class Check:
    host: str
    name: str
    status: str  # pass, warn, fail
    detail: str
    fix: str = ""


def _facts(t: Transport, own_ip: str) -> dict[str, Any]:
    cmd = sh(t.host.python, "-c", _FACTS, t.host.workdir, own_ip)
    r = t.run(cmd, timeout=120)
    if not r.ok:
        raise RuntimeError((r.err or r.out).strip().splitlines()[-1] if (r.err or r.out).strip()
                           else f"exit {r.code}")
    data: dict[str, Any] = json.loads(r.out.strip().splitlines()[-1])
    data["_local_time"] = time.time()
    return data


def start_listener(t: Transport, port: int, expect: int,
                   seconds: int = LISTEN_S) -> tuple[bool, str, str]:
    """Start a listener on the node (port 0: any free one) that lives until `expect` connections
    came or `seconds` passed. Returns (listening?, the port or why not, its pid)."""
    listen = sh("timeout", str(seconds + 5), t.host.python, "-I", "-S", "-c", _LISTEN, str(port),
                str(seconds), str(expect), LISTENER_MARK)
    script = "\n".join([
        'f=$(mktemp "${TMPDIR:-/tmp}/fleet-listen.XXXXXX") || exit 1',
        f'{listen} > "$f" 2>&1 < /dev/null &',
        'i=0; while [ ! -s "$f" ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i+1)); done',
        'cat "$f"; rm -f "$f"',
    ])
    return parse_listener(t.run(script, timeout=30, what="start a test listener").out)


def parse_listener(out: str) -> tuple[bool, str, str]:
    out = out.strip()
    if out.startswith("listening "):
        _, port_text, pid = out.split()[:3]
        return True, port_text, pid
    return False, out.removeprefix("busy ") or "the listener did not start", ""


def stop_listener(t: Transport, pid: str) -> None:
    """Free the port at once (a worker that could not connect leaves the listener waiting).
    The pid is the node's word: only a plain one above 1 (`kill 0` or `kill 1` would reach every
    process of the shell's group, or init), and only while it is still a listener of fleet's
    (once the listener ended by itself the pid may name anything)."""
    if (n := number(pid, 1 << 22)) is not None and n > 1:
        proc = f"/proc/{pid}/cmdline"
        t.run(sh("grep", "-qzxF", LISTENER_MARK, proc) + " 2>/dev/null && "
              + sh("kill", pid) + " 2>/dev/null; true", timeout=15, what="stop the listener")


class Cancelled(Exception):
    """The port checks were given up (the upload beside them failed): no new listener."""


class Listeners:
    """The test listeners one round of port checks starts on the nodes, so that whoever gives
    up on the checks can end them at once: none may outlive a launch that failed."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self._lock = threading.Lock()
        self._started: list[tuple[Transport, str]] = []

    def start(self, t: Transport, port: int, expect: int) -> tuple[bool, str, str]:
        if self.cancelled.is_set():
            raise Cancelled("the port checks were given up")
        ok, info, pid = start_listener(t, port, expect)
        with self._lock:
            late = self.cancelled.is_set()  # given up while it started: stop_all missed it
            if ok and not late:
                self._started.append((t, pid))
        if ok and late:
            stop_listener(t, pid)
            raise Cancelled("the port checks were given up")
        faults.point("preflight-listening")
        return ok, info, pid

    def stop_all(self) -> None:
        """Cancel what has not started; end every listener started (those that ended by
        themselves are left alone: stop_listener checks)."""
        self.cancelled.set()
        with self._lock:
            started, self._started = self._started, []
        each(((t.host.name + "/" + pid, (t, pid)) for t, pid in started),
             lambda tp: stop_listener(*tp))


def can_connect(t: Transport, addr: str, port: str | int) -> tuple[bool, str]:
    """Whether a TCP connection opens from the node; raises if the node's python cannot even
    try (a broken interpreter is not a firewall)."""
    r = t.run(connect_script(t.host.python, addr, port), timeout=20, what="connect test")
    if r.ok:
        return True, ""
    why = r.out.strip().splitlines()[-1] if r.out.strip() else "timed out"
    if r.code != 1:
        raise RuntimeError(f"cannot test the connection with {t.host.python}: {why}")
    return False, why


def port_checks(session: dict[str, Transport], master: Host, master_ip: str, port: int,
                addrs: dict[str, str], listeners: Listeners | None = None) -> list[Check]:
    """The master's rendezvous port is free there and every worker reaches it over TCP; and the
    master reaches a port on every worker (torchrun's collectives connect both ways). The test
    listeners are started through `listeners`, where the caller may have to end them early."""
    listeners = listeners or Listeners()
    tm = session[master.name]
    workers = [(n, t) for n, t in session.items() if n != master.name]
    ok, info, pid = listeners.start(tm, port, len(workers))
    if not ok:
        return [Check(master.name, "rendezvous port", FAIL,
                      f"port {port} is taken on the master: {info}",
                      "stop what holds it (`fleet ps`, `fleet stop RUN`) or choose another "
                      "`port` under [rendezvous] in the job")]
    checks = [Check(master.name, "rendezvous port", PASS, f"{master_ip}:{port} free")]

    def reach(t: Transport) -> Check:
        good, why = can_connect(t, master_ip, port)
        if good:
            return Check(t.host.name, "reach master", PASS, f"TCP to {master_ip}:{port}")
        return Check(t.host.name, "reach master", FAIL,
                     f"cannot open TCP to the master {master_ip}:{port}: {why}",
                     f"a firewall on the master or between the hosts blocks port {port}: allow "
                     f"TCP {port} (and the ephemeral ports Gloo/NCCL use) from the other nodes")

    def back(t: Transport) -> Check:
        good, info, lpid = listeners.start(t, 0, 1)
        if not good:
            return Check(t.host.name, "reached by master", WARN, f"no test listener: {info}")
        own = addrs.get(t.host.name) or t.host.address
        ok2, why = can_connect(tm, own, info)
        if not ok2:  # else it ended by itself, after that one connection
            stop_listener(t, lpid)
        if ok2:
            return Check(t.host.name, "reached by master", PASS, f"TCP {own}:{info} from master")
        return Check(t.host.name, "reached by master", FAIL,
                     f"the master cannot open TCP to {own}:{info}: {why}",
                     "a firewall on this node blocks incoming TCP from the other nodes; Gloo "
                     "and NCCL connect on ephemeral ports, so allow TCP from the cluster subnet")

    # Both directions for every worker, all at once. The master's listener ends by itself once
    # every worker reached it; it is killed otherwise.
    tests = {"reach master": reach, "reached by master": back}
    results = each(((f"{what}/{n}", (what, t)) for what in tests for n, t in workers),
                   lambda wt: tests[wt[0]](wt[1]))
    if any(not isinstance(r := results[f"reach master/{n}"], Check) or r.status != PASS
           for n, _ in workers):
        stop_listener(tm, pid)
    for what in tests:
        for n, _ in workers:
            r = results[f"{what}/{n}"]
            checks.append(r if isinstance(r, Check) else Check(n, "network", FAIL, reason(r)))
    return checks


def run_checks(inventory: Inventory, job: Job) -> list[Check]:
    hosts = {h.name: h for h in inventory.hosts}
    checks: list[Check] = []
    conn = each(((h.name, h) for h in inventory.hosts), open_transport)
    session = {n: t for n, t in conn.items() if isinstance(t, Transport)}
    try:
        for name, r in conn.items():
            if isinstance(r, Exception):
                checks.append(Check(name, "ssh", FAIL, reason(r), _ssh_fix(hosts[name])))
            else:
                checks += connection_checks(r)
        master = inventory.hosts[0]
        if master.name not in session:
            return checks
        try:
            master_ip = master_address(inventory, probe(session[master.name], None))
        except FleetError as e:
            checks.append(Check(master.name, "probe", FAIL, str(e)))
            return checks
        found = each(session.items(), lambda t: probe(t, master_ip))
        facts = {n: f for n, f in found.items() if isinstance(f, Facts)}
        for name, fr in found.items():
            if isinstance(fr, Exception):
                checks.append(Check(name, "probe", FAIL, reason(fr)))
        nets: dict[str, NodeNet | Exception] = {}
        for name, f in facts.items():
            try:
                nets[name] = net_for(hosts[name], f, master_ip)
            except RuntimeError as e:
                nets[name] = e
        checks += _storage_checks(facts)

        def own_ip(name: str) -> str:
            net = nets.get(name)
            return (net.address if isinstance(net, NodeNet) else None) or hosts[name].address

        details = each(session.items(), lambda t: _facts(t, own_ip(t.host.name)))
        for name, dr in details.items():
            if isinstance(dr, Exception):
                checks.append(Check(name, "python", FAIL, reason(dr),
                                    f"set `python` for {name} in the inventory to an interpreter "
                                    "with torch (the venv's full path)"))
        good = {n: f for n, f in details.items() if isinstance(f, dict)}
        checks += _version_checks(good, master.name)
        chosen = {n: t for n, t in session.items() if hosts[n].gpus}
        for name, g in each(chosen.items(), gpu_facts).items():
            checks.append(_chosen_gpu_check(hosts[name], g))
        for name, d in good.items():
            checks += _node_checks(name, d, node_nproc(job, hosts[name]),
                                   alone=len(hosts) == 1, chosen=name in chosen)
            checks.append(_write_check(session[name]))
            net = nets.get(name)
            if isinstance(net, NodeNet):
                checks.append(Check(name, "interface", PASS if net.interface or
                                    len(inventory.hosts) == 1 else WARN,
                                    f"{net.interface or '-'} ({net.reason})"))
            elif net is not None:
                checks.append(Check(name, "interface", FAIL, reason(net),
                                    "the node has no route to the master's address"))
        if all(n in session for n in hosts):
            checks += port_checks(session, master, master_ip, job.rendezvous.port,
                                  {n: own_ip(n) for n in session})
    finally:
        for t in session.values():
            t.close()
    return checks


def connection_checks(t: Transport) -> list[Check]:
    """How the node takes commands and files: login shell, rc files that print, SFTP."""
    name = t.host.name
    out = [Check(name, "ssh", PASS, f"{t.host.transport} {t.host.address}"
                 + (f", login shell {t.shell}" if t.shell else ""))]
    noise = [line for line in t.noise.splitlines() if line.strip()]
    if noise:
        out.append(Check(name, "rc files", WARN,
                         f"the login shell prints {len(noise)} line(s) for every command: "
                         f"{noise[0][:60]!r} (fleet ignores them)", RC_FIX))
    if isinstance(t, SSHTransport):
        if t.sftp_available():
            out.append(Check(name, "sftp", PASS, "available"))
        elif t.sftp_garbled:
            out.append(Check(name, "sftp", WARN, f"not usable ({t.sftp_problem}): fleet sends "
                             "files over the exec channel (verified, a little slower)", RC_FIX))
        else:
            out.append(Check(name, "sftp", WARN, f"not available ({t.sftp_problem}): fleet sends "
                             "files over the exec channel (verified, a little slower)",
                             "nothing to do; a `Subsystem sftp` line in sshd_config makes large "
                             "syncs faster"))
    return out


RC_FIX = ("scp, rsync and sshd's external sftp-server (Debian's default) break on such output: "
          "print only in interactive shells (bash: `[[ $- == *i* ]] || return` at the top of "
          "~/.bashrc; zsh: move it from ~/.zshenv to ~/.zshrc; fish: `status is-interactive; or "
          "exit`; tcsh: `if ($?prompt) then ... endif`)")


def _storage_checks(facts: dict[str, Facts]) -> list[Check]:
    out = []
    for group in storage_groups(facts):
        for name in group:
            others = [n for n in group if n != name]
            out.append(Check(name, "storage", PASS,
                             f"workdir shared with {', '.join(others)}: synced once, run "
                             "directories apart" if others else "workdir on its own storage"))
    return out


def _write_check(t: Transport) -> Check:
    """Write (verified) and remove a 1 MiB file in the workdir: a full disk or quota fails."""
    path = f"{t.path(t.host.workdir)}/.fleet-write-test"
    try:
        t.write(path, b"\0" * (1 << 20), 0o600)
    except FleetError as e:
        return Check(t.host.name, "write", FAIL, str(e),
                     "free space or quota there, or set `workdir` for this host elsewhere")
    finally:
        t.run(sh("rm", "-f", path), what="remove the write test")
    return Check(t.host.name, "write", PASS, f"1 MiB written and read back in {t.host.workdir}")


def _ssh_fix(h: Host) -> str:
    if h.transport == "local":
        return ""
    port = h.port or 22
    return (f"check that sshd runs on {h.address}:{port} and that `ssh -p {port} "
            f"{h.user + '@' if h.user else ''}{h.address}` works with the same key")


def _version_checks(facts: dict[str, dict[str, Any]], master: str) -> list[Check]:
    out = []
    for key in ("python", "torch", "torchvision", "cuda", "nccl", "driver"):
        values = {n: str(f.get(key, "")) for n, f in facts.items()}
        if not any(values.values()):
            continue
        ref = values.get(master) or next(v for v in values.values() if v)
        for name, v in values.items():
            if v == ref:
                out.append(Check(name, key, PASS, v))
            else:
                out.append(Check(name, key, FAIL, f"{v or 'missing'} here, {ref} on {master}",
                                 f"install the same {key} version on every node"))
    for name, f in facts.items():
        if "torch_error" in f:
            out.append(Check(name, "torch", FAIL, f["torch_error"],
                             "install torch in the node's python, or point `python` at a venv "
                             "that has it"))
    return out


def _chosen_gpu_check(host: Host, g: GpuFacts | Exception) -> Check:
    """The GPUs the inventory chose for this node: there, and not busy with another user's
    work (a warning: sharing may be agreed; torch would fail or crawl otherwise)."""
    chosen = ",".join(map(str, host.gpus or ()))
    if isinstance(g, Exception):
        return Check(host.name, "chosen gpus", WARN, f"could not list GPUs: {reason(g)}")
    why = absent(host.gpus or (), g)
    if why:
        return Check(host.name, "chosen gpus", WARN, f"gpus = {chosen}: {why}",
                     f"fix `gpus` for {host.name} in the inventory (nvidia-smi -L lists them)")
    taken = busy(host.gpus or (), g)
    if taken:
        return Check(host.name, "chosen gpus", WARN, f"gpus = {chosen}: " + "; ".join(taken),
                     "agree with that user, or choose free GPUs (nvidia-smi shows which)")
    return Check(host.name, "chosen gpus", PASS, f"gpus = {chosen}: present, no other user's "
                                                  "process on them")


def _node_checks(name: str, f: dict[str, Any], nproc: int | str, alone: bool,
                 chosen: bool = False) -> list[Check]:
    out = []
    gpus = int(f.get("gpus", 0))
    if nproc == "gpu" and gpus == 0:
        out.append(Check(name, "gpus", FAIL, "nproc_per_node = \"gpu\" but no GPU is visible",
                         "use a number (CPU processes) or check the driver (nvidia-smi)"))
    elif isinstance(nproc, int) and gpus and nproc > gpus:
        out.append(Check(name, "gpus", FAIL, f"{nproc} processes for {gpus} GPU(s)",
                         "set nproc_per_node to the GPU count (or \"gpu\")"))
    else:
        out.append(Check(name, "gpus", PASS, f"{gpus} GPU(s)" if gpus else "none (Gloo on CPU)"))
    running = f.get("gpu_processes") or []
    if running and not chosen:  # with chosen GPUs, "chosen gpus" says whose are on them
        out.append(Check(name, "gpu processes", WARN, f"{len(running)} running: {running[0]}",
                         "another job is using the GPUs; `nvidia-smi` shows which (or choose "
                         "free ones with `gpus` in the inventory)"))
    resolved = f.get("hostname_resolves", [])
    if not resolved:
        out.append(Check(name, "hostname", WARN, f"{f.get('hostname')} does not resolve: "
                         f"{f.get('hostname_error', '')}",
                         "add the hostname to /etc/hosts with the node's real IP"))
    elif all(a.startswith("127.") or a == "::1" for a in resolved) and not alone:
        out.append(Check(name, "hostname", WARN,
                         f"{f.get('hostname')} resolves to {', '.join(resolved)} (loopback)",
                         "fleet sets the interface and addresses itself, but tools that use "
                         "the hostname will not reach this node: map it to its real IP in "
                         "/etc/hosts"))
    else:
        out.append(Check(name, "hostname", PASS, f"{f.get('hostname')} -> {resolved[0]}"))
    rdns = float(f.get("reverse_dns_s", 0))
    out.append(Check(name, "reverse dns", WARN if rdns > REVERSE_DNS_WARN_S else PASS,
                     f"reverse lookup took {rdns:.2f}s",
                     "a slow resolver delays every connection torch makes (the seeds saw a "
                     "44 s start): fix /etc/resolv.conf or list the nodes in /etc/hosts"
                     if rdns > REVERSE_DNS_WARN_S else ""))
    skew = float(f["time"]) - float(f["_local_time"])
    out.append(Check(name, "clock", WARN if abs(skew) > CLOCK_SKEW_WARN_S else PASS,
                     f"{skew:+.1f}s from this machine",
                     "run NTP (chrony/systemd-timesyncd) on every node"
                     if abs(skew) > CLOCK_SKEW_WARN_S else ""))
    free = int(f.get("disk_free", 0))
    status = FAIL if free < DISK_FAIL_BYTES else WARN if free < DISK_WARN_BYTES else PASS
    out.append(Check(name, "disk", status, f"{free / 2**30:.1f} GiB free in {f.get('disk_path')}",
                     "free space or point `workdir` at a larger disk" if status != PASS else ""))
    return out


def table(checks: list[Check]) -> str:
    order = {n: i for i, n in enumerate(dict.fromkeys(c.host for c in checks))}
    rows = sorted(checks, key=lambda c: order[c.host])
    width = max((len(c.host) for c in rows), default=4)
    lines = [f"{'HOST':<{width}}  {'CHECK':<17} {'STATUS':<6} DETAIL"]
    for c in rows:
        lines.append(f"{c.host:<{width}}  {c.name:<17} {c.status.upper():<6} {c.detail}")
        if c.fix and c.status != PASS:
            lines.append(f"{'':<{width}}  {'':<17} {'':<6} fix: {c.fix}")
    return "\n".join(lines)



def collective_job(job: Job) -> Job:
    """The bandwidth test as a job on the same inventory, processes and port as `job`."""
    import fleet.nodejobs
    workdir = Path(fleet.nodejobs.__file__).parent
    return Job(path=job.path, name="fleet-collective", inventory=job.inventory, workdir=workdir,
               script="collective.py", nproc_per_node=job.nproc_per_node, env=job.env,
               rendezvous=job.rendezvous, exclude=DEFAULT_EXCLUDE)
