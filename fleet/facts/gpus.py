"""A node's GPUs, as nvidia-smi reports them: one command and a pure parser, and what fleet
makes of the GPUs an inventory chooses for a node (absent, or busy with another user's work)."""

from __future__ import annotations

from dataclasses import dataclass

from fleet.indices import ranges
from fleet.nodedata import number
from fleet.transport import Transport

# Indices are nvidia-smi's (PCI bus order; fleet sets CUDA_DEVICE_ORDER=PCI_BUS_ID to match).
# The owner of each compute process comes from ps: nvidia-smi does not say it.
GPU_SCRIPT = "\n".join([
    "command -v nvidia-smi >/dev/null 2>&1 || { echo 'nvidia-smi=missing'; exit 0; }",
    'echo "me=$(id -un)"',
    "echo '=== gpus'",
    "nvidia-smi --query-gpu=index,uuid,memory.used,memory.total,name "
    "--format=csv,noheader,nounits 2>&1",
    "echo '=== apps'",
    "nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits "
    "2>/dev/null | while IFS=', ' read -r uuid pid mem; do",
    '  echo "$uuid,$pid,$mem,$(ps -o user= -p "$pid" 2>/dev/null)"',
    "done",
])


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    used_mib: int
    total_mib: int
    name: str


@dataclass(frozen=True)
class GpuApp:
    """A compute process on a GPU: its owner is "" where this node cannot see it (another
    container's process)."""

    gpu_uuid: str
    pid: int
    used_mib: int
    user: str


@dataclass(frozen=True)
class GpuFacts:
    smi: bool  # nvidia-smi exists on the node
    gpus: tuple[Gpu, ...] = ()
    apps: tuple[GpuApp, ...] = ()
    me: str = ""  # the user fleet logs in as
    error: str = ""  # what nvidia-smi said when it failed (no driver, say)

    @property
    def count(self) -> int:
        return len(self.gpus)


def _int(text: str) -> int | None:
    return number(text)


def parse_gpus(out: str) -> GpuFacts:
    if "nvidia-smi=missing" in out.split():
        return GpuFacts(smi=False)
    me, section = "", None
    gpus: list[Gpu] = []
    apps: list[GpuApp] = []
    errors: list[str] = []
    for line in out.splitlines():
        if line.startswith("me="):
            me = line[3:].strip()
        elif line.startswith("=== "):
            section = line[4:].strip()
        elif section == "gpus" and line.strip():
            f = [x.strip() for x in line.split(",", 4)]
            index, used, total = (_int(f[0]), _int(f[2]), _int(f[3])) if len(f) == 5 else (
                None, None, None)
            if index is None or used is None or total is None:
                errors.append(line.strip())
                continue
            gpus.append(Gpu(index, f[1], used, total, f[4]))
        elif section == "apps" and line.strip():
            f = [x.strip() for x in line.split(",", 3)]
            pid, used = (_int(f[1]), _int(f[2])) if len(f) == 4 else (None, None)
            if pid is not None:
                apps.append(GpuApp(f[0], pid, used or 0, f[3]))
    return GpuFacts(smi=True, gpus=tuple(gpus), apps=tuple(apps), me=me,
                    error="; ".join(errors)[:300])


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


def busy(chosen: tuple[int, ...], facts: GpuFacts) -> list[str]:
    """The chosen GPUs that hold memory of another user's process (or of a process this node
    cannot see, which is another container's)."""
    by_uuid = {g.uuid: g for g in facts.gpus if g.index in chosen}
    out = []
    for a in facts.apps:
        g = by_uuid.get(a.gpu_uuid)
        if g is None or (a.user and a.user == facts.me):
            continue
        owner = f"user {a.user}" if a.user else "a process not visible here"
        out.append(f"GPU {g.index} has {a.used_mib} MiB in use by {owner} (pid {a.pid})")
    return out
