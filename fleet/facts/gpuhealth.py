"""`fleet doctor`'s look at a node's GPUs: nvidia-smi's ECC error counters, retired pages,
throttle reasons and PCIe link, and the kernel log's Xid errors; one command and a pure
parser."""

from __future__ import annotations

from dataclasses import dataclass

from fleet.console import printable
from fleet.facts.gpus import _smi_number
from fleet.nodedata import number

FIELDS = ("index", "ecc.errors.uncorrected.volatile.total", "ecc.errors.corrected.volatile.total",
          "retired_pages.pending", "retired_pages.double_bit.count",
          "clocks_throttle_reasons.active", "pcie.link.gen.current", "pcie.link.gen.max",
          "pcie.link.width.current", "pcie.link.width.max")
# NVML's clocks throttle reasons that mean a GPU slows for a fault, not by choice: HW slowdown,
# SW thermal, HW thermal, HW power brake (idle, application clocks, the power cap and sync boost
# are ordinary).
BAD_THROTTLE = {0x8: "hardware slowdown", 0x20: "thermal (software)",
                0x40: "thermal (hardware)", 0x80: "power brake"}

GPU_HEALTH_SCRIPT = "\n".join([
    "command -v nvidia-smi >/dev/null 2>&1 || { echo 'nvidia-smi=missing'; exit 0; }",
    "T=; command -v timeout >/dev/null 2>&1 && T='timeout 10'",
    "echo '=== gpus'",
    f"$T nvidia-smi --query-gpu={','.join(FIELDS)} --format=csv,noheader,nounits 2>&1",
    'echo "=== rc $?"',
    "if dmesg >/dev/null 2>&1; then echo \"xid=$(dmesg 2>/dev/null | grep -ac 'NVRM: Xid')\"; fi",
])


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's counters; None where nvidia-smi says [N/A] or the like."""

    index: int
    ecc_uncorrected: int | None = None
    ecc_corrected: int | None = None
    retired_pending: bool | None = None
    retired_double: int | None = None
    throttle: int | None = None  # the active reasons' bit mask
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None

    def faults(self) -> list[str]:
        """What is wrong with this GPU, in words (none: all is well)."""
        out = []
        if self.ecc_uncorrected:
            out.append(f"{self.ecc_uncorrected} uncorrected ECC errors")
        if self.retired_pending:
            out.append("retired pages pending a reset")
        if self.retired_double:
            out.append(f"{self.retired_double} pages retired for double-bit errors")
        bad = [w for bit, w in BAD_THROTTLE.items() if self.throttle and self.throttle & bit]
        if bad:
            out.append("throttled: " + ", ".join(bad))
        if self.pcie_width and self.pcie_width_max and self.pcie_width < self.pcie_width_max:
            out.append(f"PCIe link x{self.pcie_width} of x{self.pcie_width_max}")
        return out


@dataclass(frozen=True)
class GpuHealthFacts:
    smi: bool = False
    gpus: tuple[GpuHealth, ...] = ()
    xid: int | None = None  # Xid lines in the kernel log, where it could be read
    error: str = ""


def _hex(text: str) -> int | None:
    text = text.strip().lower()
    if text.startswith("0x") and 2 < len(text) <= 18 and all(c in "0123456789abcdef"
                                                              for c in text[2:]):
        return int(text, 16)
    return None


def parse_gpu_health(out: str) -> GpuHealthFacts:
    section, rc, xid = "", 0, None
    gpus: list[GpuHealth] = []
    errors: list[str] = []
    for line in out.split("\n"):
        if line.strip() == "nvidia-smi=missing":
            return GpuHealthFacts(smi=False)
        if line.startswith("=== "):
            head = line[4:].split()
            section = head[0] if head else ""
            if section == "rc" and len(head) == 2:
                rc = number(head[1], 256) or 0
        elif line.startswith("xid=") and section == "rc":
            xid = number(line[4:])
        elif section == "gpus" and line.strip():
            f = [x.strip() for x in line.split(",")]
            index = number(f[0], 1024) if len(f) == len(FIELDS) else None
            if index is None:
                errors.append(printable(line.strip())[:200])
                continue
            pending = {"yes": True, "no": False}.get(f[3].lower())
            n = [_smi_number(x) for x in f]
            gpus.append(GpuHealth(index, n[1], n[2], pending, n[4], _hex(f[5]), *n[6:]))
    if rc and not errors:
        errors.append(f"nvidia-smi exited with {rc}")
    if len({g.index for g in gpus}) < len(gpus):
        errors.append("nvidia-smi listed a GPU twice")
        gpus = []
    return GpuHealthFacts(True, tuple(gpus), xid, "; ".join(errors)[:300])
