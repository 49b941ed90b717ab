"""A node's GPUs, as nvidia-smi reports them, and the leases recorded there (fleet.facts.leases):
one command and a pure parser; and what fleet makes of the GPUs an inventory chooses for a node
(absent, or busy with another user's work)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleet.facts.leases import LEASE_DIR, MAX_NAMES, MAX_RECORDS, Lease, parse_lease
from fleet.indices import ranges
from fleet.nodedata import number

if TYPE_CHECKING:
    from fleet.transport import Transport

# Indices are nvidia-smi's (PCI bus order; fleet sets CUDA_DEVICE_ORDER=PCI_BUS_ID to match).
# nvidia-smi does not say who owns a compute process, how old it is or what it runs: ps does;
# a process's fleet run is in its environment, which only its owner (or root) may read.
# Lease files: regular files only (never a link), each read up to 4 KiB. Anyone may write
# there: any name, an empty file's too, costs a name only, listed unsorted and cut at
# MAX_NAMES (a glob would expand them all first); past MAX_NAMES names or MAX_RECORDS records
# the listing stops and says so (`=== leases cut ...`), a directory that is a link or no directory
# too (`=== leases bad`): the host's leases are then unknown, which `up` treats as in the way.
GPU_SCRIPT = "\n".join([
    'echo "me=$(id -un)"',
    'echo "now=$(date +%s)"',
    # A wedged driver can hang nvidia-smi, a FIFO named *.lease a reader: bounded where the
    # node has coreutils' timeout.
    "T=; T2=; command -v timeout >/dev/null 2>&1 && { T='timeout 10'; T2='timeout 2'; }",
    "echo '=== leases'",
    f"D={LEASE_DIR}; n=0; k=0",
    'if [ -L "$D" ] || { [ -e "$D" ] && [ ! -d "$D" ]; }; then echo "=== leases bad"; else',
    f'ls -f "$D" 2>/dev/null | head -n {MAX_NAMES + 3} | while IFS= read -r b; do',
    '  case "$b" in .|..) continue;; esac',
    f"  n=$((n + 1)); [ $n -le {MAX_NAMES} ] || {{ echo '=== leases cut names'; break; }}",
    '  case "$b" in .*) continue;; *.lease) f="$D/$b";; *) continue;; esac',
    '  [ -f "$f" ] && [ ! -L "$f" ] && [ -s "$f" ] || continue',
    f"  k=$((k + 1)); [ $k -le {MAX_RECORDS} ] || {{ echo '=== leases cut records'; break; }}",
    # its owner's name, uid and last status change (ctime, which its owner cannot set); the
    # record as printable ASCII only (as fleet writes it), so that nothing in it can start a
    # line of its own
    "  printf '%s\\t%s\\n' \"$(stat -c '%U %u %Z' \"$f\")\" "
    "\"$($T2 head -c 4096 \"$f\" | LC_ALL=C tr -cd ' -~')\"",
    "done",
    "fi",
    "command -v nvidia-smi >/dev/null 2>&1 || { echo 'nvidia-smi=missing'; exit 0; }",
    "echo '=== gpus'",
    "$T nvidia-smi --query-gpu=index,uuid,memory.used,memory.total,utilization.gpu,name "
    "--format=csv,noheader,nounits 2>&1",
    'echo "=== rc $?"',
    "echo '=== apps'",
    "$T nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits "
    "2>/dev/null | while IFS=', ' read -r uuid pid mem; do",
    '  case "$pid" in *[!0-9]*|"") continue;; esac',
    '  run=$(tr "\\0" "\\n" < "/proc/$pid/environ" 2>/dev/null | sed -n "s/^FLEET_RUN_ID=//p" '
    "| head -n 1)",
    # ps cuts a long user name to 8 characters (christo+): the owner of /proc/PID is whole
    '  user=$(stat -c %U "/proc/$pid" 2>/dev/null)',
    '  ps -o etimes=,args= -p "$pid" 2>/dev/null | head -n 1 | {',
    "    read -r age args",
    "    printf '%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\n' \"$uuid\" \"$pid\" \"$mem\" \"$user\" "
    "\"$age\" \"$run\" \"$(printf %s \"$args\" | tr -d '\\001-\\037\\177' | cut -c 1-300)\"",
    "  }",
    "done",
])


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    used_mib: int
    total_mib: int
    name: str
    util: int | None = None  # percent busy in nvidia-smi's last sample; None: not reported


@dataclass(frozen=True)
class GpuApp:
    """A compute process on a GPU: its owner is "" where this node cannot see it (another
    container's process); its age (seconds) is None then too; its fleet run "" where it is none
    or only its owner may know."""

    gpu_uuid: str
    pid: int
    used_mib: int
    user: str
    age_s: int | None = None
    command: str = ""
    run_id: str = ""


@dataclass(frozen=True)
class GpuFacts:
    smi: bool  # nvidia-smi exists on the node
    gpus: tuple[Gpu, ...] = ()
    apps: tuple[GpuApp, ...] = ()
    me: str = ""  # the user fleet logs in as
    error: str = ""  # what nvidia-smi said when it failed (no driver, an NVML error)
    leases: tuple[Lease, ...] = ()  # unexpired or not: Lease.active(now) tells
    now: float = 0.0  # the node's clock when asked (leases end by it)
    unknown: str = ""  # why not every lease here was read (then any may be in the way)

    @property
    def count(self) -> int:
        return len(self.gpus)

    def gpu(self, uuid: str) -> Gpu | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)

    def on(self, index: int) -> list[GpuApp]:
        """The compute processes on GPU `index`."""
        return [a for a in self.apps if (g := self.gpu(a.gpu_uuid)) is not None
                and g.index == index]

    def active_leases(self) -> list[Lease]:
        return [lease for lease in self.leases if lease.active(self.now)]


_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_SAFE = re.compile(r"[^\x20-\x7e]")  # a user name or uuid from a node: printable ASCII only


def _word(text: str, limit: int = 64) -> str:
    return _SAFE.sub("?", text.strip())[:limit]


def _smi_number(text: str) -> int | None:
    """nvidia-smi's value: a number, or None for "[N/A]", "[Not Supported]" and the like."""
    return number(text.strip().split(" ")[0] if text.strip() else "")


def parse_gpus(out: str) -> GpuFacts:
    me, now, section, unknown = "", 0.0, None, ""
    gpus: list[Gpu] = []
    apps: list[GpuApp] = []
    leases: list[Lease] = []
    errors: list[str] = []
    junk: dict[str, int] = {}  # per owner, *.lease files that hold no lease
    smi, rc = True, 0
    for line in out.split("\n"):  # not splitlines(): a node's \r or \x1c is no line break
        if line.startswith("me=") and section is None:
            me = _word(line[3:])
        elif line.startswith("now=") and section is None:
            now = float(number(line[4:]) or 0)
        elif line.strip() == "nvidia-smi=missing":
            smi = False
        elif line.startswith("=== "):
            head = line[4:].split()
            section = head[0] if head else None
            if section == "rc" and len(head) == 2:
                rc = number(head[1]) or 0
            elif section == "leases" and len(head) > 1:
                unknown = _UNKNOWN.get(" ".join(head[1:3]), "its lease directory is unreadable")
        elif section == "leases" and line.strip():
            lease = _lease(line)
            if lease is not None:
                leases.append(lease)
            else:
                junk[_owner(line)] = junk.get(_owner(line), 0) + 1
        elif section == "gpus" and line.strip():
            f = [x.strip() for x in line.split(",", 5)]
            index, used, total = (number(f[0]), _smi_number(f[2]), _smi_number(f[3])) \
                if len(f) == 6 else (None, None, None)
            if index is None or used is None or total is None:
                errors.append(line.strip())
                continue
            gpus.append(Gpu(index, _word(f[1], 96), used, total, _word(f[5], 96),
                            _smi_number(f[4])))
        elif section == "apps" and line.strip():
            app = _app(line)
            if app is not None:
                apps.append(app)
    if rc and not errors:
        errors.append("nvidia-smi gave no answer in 10 s" if rc == 124 else
                      f"nvidia-smi exited with {rc}")
    if len({g.index for g in gpus}) < len(gpus) or len({g.uuid for g in gpus}) < len(gpus):
        errors.append("nvidia-smi listed a GPU twice")  # not nvidia-smi's doing: trust none
        gpus = []
    known = {g.uuid for g in gpus}
    return GpuFacts(smi=smi, gpus=tuple(gpus) if smi else (),
                    apps=tuple(a for a in apps if a.gpu_uuid in known) if smi else (), me=me,
                    error="; ".join(_word(e, 300) for e in errors)[:300] if smi else "",
                    leases=tuple(leases), now=now, unknown=_unknown(unknown, junk))


_UNKNOWN = {
    "bad": f"{LEASE_DIR} is a link or no directory (root can remove it; fleet reserve makes it "
           "again)",
    "cut names": f"{LEASE_DIR} holds over {MAX_NAMES} names",
    "cut records": f"{LEASE_DIR} holds over {MAX_RECORDS} *.lease files that are not empty",
}


def _unknown(why: str, junk: dict[str, int]) -> str:
    """Why a host's leases are unknown, with whose files are not leases (the flood's owner,
    most likely), or ""."""
    if not why:
        return ""
    if not junk:
        return why
    top = sorted(junk.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    return why + " (not leases: " + ", ".join(f"{n} of {o}" for o, n in top) + ")"


def _owner(line: str) -> str:
    words = line.partition("\t")[0].split()
    return _word(words[0] if words and words[0] != "UNKNOWN" else " ".join(words[1:2]), 32) \
        or "?"


def _lease(line: str) -> Lease | None:
    """`OWNER UID CTIME<tab>RECORD`: the owner's name (its uid where the host has no name for
    it), and the file's last status change, which bounds the lease's end."""
    head, _, text = line.partition("\t")
    words = head.split()
    if len(words) != 3:
        return None
    owner = words[0] if words[0] != "UNKNOWN" else words[1]
    changed = number(words[2])
    return parse_lease(_word(owner), text, float(changed) if changed is not None else None)


def _app(line: str) -> GpuApp | None:
    f = line.split("\t", 6)
    if len(f) != 7:
        return None
    pid, used = number(f[1]), number(f[2])
    if pid is None:
        return None
    run = f[5].strip()
    return GpuApp(_word(f[0], 96), pid, used or 0, _word(f[3]), number(f[4]),
                  _SAFE.sub("?", f[6].strip())[:300],
                  run if _RUN_ID.fullmatch(run) else "")


def gpu_facts(t: Transport) -> GpuFacts:
    return parse_gpus(t.run(GPU_SCRIPT, timeout=30, what="list GPUs (nvidia-smi)").out)


def absent(chosen: tuple[int, ...], facts: GpuFacts) -> str | None:
    """Why GPUs chosen in the inventory cannot be used here, if they cannot."""
    if not facts.smi:
        return "nvidia-smi is not on this node's PATH, so it has no usable NVIDIA GPU"
    if not facts.gpus:
        why = f": {facts.error}" if facts.error else ""
        return f"nvidia-smi lists no GPU{why}"
    have = {g.index for g in facts.gpus}
    missing = [i for i in chosen if i not in have]
    if missing:
        return (f"GPU(s) {', '.join(map(str, missing))} do not exist here (this node has "
                f"GPUs {ranges(sorted(have))})")
    return None


def others(chosen: tuple[int, ...], facts: GpuFacts) -> list[tuple[Gpu, GpuApp]]:
    """The processes on the chosen GPUs that are another user's (or that this node cannot see,
    which are another container's): never the login's own."""
    by_uuid = {g.uuid: g for g in facts.gpus if g.index in chosen}
    return [(g, a) for a in facts.apps if (g := by_uuid.get(a.gpu_uuid)) is not None
            and not (a.user and a.user == facts.me)]


def owner(app: GpuApp) -> str:
    """`user alice`, or `a process not visible here`."""
    return f"user {app.user}" if app.user else "a process not visible here"


def busy(chosen: tuple[int, ...], facts: GpuFacts) -> list[str]:
    """The chosen GPUs that hold memory of another user's process (or of a process this node
    cannot see, which is another container's)."""
    return [f"GPU {g.index} has {a.used_mib} MiB in use by {owner(a)} (pid {a.pid})"
            for g, a in others(chosen, facts)]
