"""Known failure signatures in node logs, and what each means and what to do."""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_LINE = 200
# Logs captured through a terminal can carry colour codes that would split a signature.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True)
class Rule:
    """One failure signature: how to spot it in a log line, what it means, how to fix it."""

    name: str
    pattern: re.Pattern[str]
    meaning: str
    fix: str
    # A line that also matches this belongs to another rule, which explains it better.
    unless: re.Pattern[str] | None = None


@dataclass(frozen=True)
class Diagnosis:
    """A rule that matched, with the first log line it matched."""

    rule: str
    line: str  # stripped, at most MAX_LINE characters
    meaning: str
    fix: str


RULES: tuple[Rule, ...] = (
    Rule(
        "no-route-to-host",
        re.compile(r"No route to host"),
        "A connection went to an address the peer cannot reach; with NCCL this usually means it "
        "picked the wrong interface or address (an IPv6, docker or other virtual interface).",
        'Pin the NIC that links the nodes with interface = "<nic>" for each host in the '
        "inventory (fleet then sets NCCL_SOCKET_IFNAME=<nic> exactly). If the address is right, "
        "a firewall is rejecting the port: allow traffic between the nodes (fleet check JOB "
        "tests the ports) rather than disabling the firewall or IPv6.",
    ),
    Rule(
        "name-resolution",
        re.compile(r"gai error: -2|Name or service not known"),
        "A node could not resolve a hostname to an address; the log line shows which name.",
        "Give the hosts as IP addresses in the inventory, or fix DNS or /etc/hosts on that node; "
        "fleet check JOB checks that the hostnames resolve.",
        # A download that could not resolve its server is the download rule's case.
        unless=re.compile(r"urlopen error|ConnectionPool\("),
    ),
    Rule(
        "gloo-loopback",
        re.compile(r"Gloo connectFullMesh failed"
                   r"|gloo/transport/tcp/pair\.cc:\d+\] connect \[127\."),
        "Gloo could not connect the processes to each other: it used an address that resolves "
        "to loopback (the hostname mapped to 127.0.x.x in /etc/hosts) or the wrong interface.",
        "Map the hostname to the node's real IP in /etc/hosts on that node. fleet sets "
        'GLOO_SOCKET_IFNAME automatically; if it chose the wrong NIC, pin interface = "<nic>" '
        "for that host in the inventory.",
    ),
    Rule(
        "nccl-system-error",
        re.compile(r"ncclSystemError|unhandled system error"),
        "An NCCL system call failed: often the wrong network interface, too little shared memory "
        "(/dev/shm in containers), or a misconfigured InfiniBand setup.",
        'Rerun with NCCL_DEBUG = "INFO" in the job\'s [env] to see which call failed; if it is '
        'the network, pin interface = "<nic>" for the host in the inventory.',
    ),
    Rule(
        "rendezvous-timeout",
        re.compile(r"RendezvousTimeoutError"
                   r"|failed to send a keep-alive heartbeat"
                   r"|The client socket has timed out"
                   r"|Timed out initializing process group in store based barrier"
                   r"|Timed out after \d+ seconds waiting for clients"
                   r"|DistStoreError: Socket Timeout"),
        "Not all nodes joined the rendezvous in time: a node failed to start, a firewall blocks "
        "the master port, or the nodes disagree on the master address.",
        "Run fleet check JOB to test hosts, ports and versions, and read the other nodes' logs "
        "for why they did not join; if the nodes are just slow, raise timeout under [rendezvous].",
    ),
    Rule(
        "download-failed",
        re.compile(r"CERTIFICATE_VERIFY_FAILED|urlopen error"
                   r"|HTTPS?ConnectionPool\(host=.*Max retries exceeded"),
        "A node could not download a dataset or file: it has no internet access or its CA "
        "certificates are broken.",
        'Download the data once locally and set data = "<dir>" in the job so fleet syncs it to '
        "every node and nothing downloads; do not turn off certificate verification.",
    ),
    Rule(
        "cuda-oom",
        re.compile(r"CUDA out of memory|OutOfMemoryError"),
        "A GPU ran out of memory.",
        "If GPU 0 shows an extra block of memory per process, each process created a context on "
        "GPU 0 because it used CUDA before calling torch.cuda.set_device(local_rank): call it "
        "first. Otherwise lower the batch size.",
    ),
    Rule(
        "duplicate-gpu",
        re.compile(r"Duplicate GPU detected"),
        "Two ranks on one node use the same GPU, usually because the script never calls "
        "torch.cuda.set_device(local_rank), or nproc_per_node exceeds the node's GPUs.",
        "Call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before any CUDA work, and keep "
        "nproc_per_node at most the number of GPUs on each node.",
    ),
    Rule(
        "address-in-use",
        re.compile(r"Address already in use|EADDRINUSE"),
        "The rendezvous port on the master is taken, usually by another run that still holds it.",
        "Stop the other run (fleet ps lists runs, fleet stop ends one) or pick another port "
        "under [rendezvous].",
    ),
    Rule(
        "connection-refused",
        re.compile(r"Connection refused|ECONNREFUSED"),
        "Nothing was listening on that address and port, or a firewall rejected it: the master "
        "had not opened the rendezvous port yet, had already exited, or the port is blocked.",
        "Run fleet check JOB to test that every node reaches the master port; if the master "
        "failed first, its own log holds the real error.",
    ),
    Rule(
        "module-not-found",
        # The second form is what `python -m torch.distributed.run` prints without torch.
        re.compile(r"ModuleNotFoundError: No module named '[^']+'"
                   r"|python[\d.]*: No module named [\w.]+"),
        "A package is missing from the python that runs the job on that node.",
        'Install it into that python, or point python = "<venv>/bin/python" for the host in '
        "the inventory at the environment that has it.",
    ),
    Rule(
        "interface-not-found",
        re.compile(r"Unable to find address for: \S+|no socket interface found"),
        "The network interface given to NCCL or Gloo does not exist, or has no address, on "
        "that node.",
        'Set interface = "<nic>" for that host in the inventory to a NIC that ip -br addr shows '
        "with the node's address, and drop any NCCL_SOCKET_IFNAME or GLOO_SOCKET_IFNAME from "
        "the job's [env].",
    ),
)


def _clip(line: str, start: int) -> str:
    """The line, cut to MAX_LINE characters around where the signature starts."""
    if len(line) <= MAX_LINE:
        return line
    # Keep some context before the signature, but never scroll past the line's end.
    begin = max(0, min(start - 60, len(line) - MAX_LINE))
    text = line[begin:begin + MAX_LINE]
    if begin > 0:
        text = "…" + text[1:]
    if begin + MAX_LINE < len(line):
        text = text[:-1] + "…"
    return text


def diagnose(text: str) -> list[Diagnosis]:
    """Each rule that matches the log text, once, in the order it first appears."""
    found: list[Diagnosis] = []
    seen: set[str] = set()
    for raw in text.splitlines():
        line = _ANSI.sub("", raw).strip()
        hits: list[tuple[int, Rule]] = []
        for rule in RULES:
            if rule.name in seen:
                continue
            m = rule.pattern.search(line)
            if m is not None and not (rule.unless and rule.unless.search(line)):
                hits.append((m.start(), rule))
        for start, rule in sorted(hits, key=lambda h: h[0]):
            seen.add(rule.name)
            found.append(Diagnosis(rule.name, _clip(line, start), rule.meaning, rule.fix))
    return found


def format_diagnoses(ds: list[Diagnosis]) -> list[str]:
    """Two lines per diagnosis: the log line that matched, then what it means and the fix."""
    out: list[str] = []
    for d in ds:
        out.append(f"seen: {d.line}")
        out.append(f"hint: {d.meaning} Fix: {d.fix}")
    return out
