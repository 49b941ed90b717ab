"""A stand-in for nvidia-smi on a testbed host (which has no GPU): it answers the queries fleet
makes, in the real program's formats, from a JSON state file, and a GPU's processes are real
processes of the host, so that one ending frees its GPU as on a real machine.

The state (TB_NVIDIA_SMI_STATE, else /tmp/.tb-nvidia-smi.json, the host's private /tmp):
  {"gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "utilization": 0,
             "uuid": "GPU-..." (optional)}, ...],
   "apps": [{"gpu": 1, "pid": 1234, "used_mib": 18432}],
   "fail": null | "no-driver" | "version-mismatch",
   a GPU's health counters too (optional, healthy by default: see HEALTH): "ecc_uncorrected",
   "ecc_corrected", "retired_pending" ("Yes"/"No"), "retired_double", "throttle" (a hex mask),
   "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max",
   "driver": "550.54.15" (optional)}
A GPU's index is its place in "gpus". An app is listed while its pid lives (not a zombie); a
GPU's memory.used is the sum of its live apps' used_mib, its utilization.gpu its "utilization"
while a live app is on it, else 0. "fail" makes every call fail as the real one does.

Texts and exit codes as the real nvidia-smi prints them (stdout, not stderr): the man page's
RETURN VALUE (2 a bad argument, 6 nothing found, 9 no driver), 18 for NVML's
LIB_RM_VERSION_MISMATCH with the library's version on a second line; with no process on any
GPU a csv query prints its header only, or nothing at all with noheader.
Stdlib only: it runs under the host's `python -I`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

STATE = "/tmp/.tb-nvidia-smi.json"  # noqa: S108 - inside a testbed host: its private /tmp
DRIVER = "550.54.15"
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.")
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"
INVALID = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
NO_DEVICES = "No devices were found"
EXIT_INVALID, EXIT_NOT_FOUND, EXIT_NO_DRIVER, EXIT_MISMATCH = 2, 6, 9, 18

# name -> (the name the header prints, its unit or "")
GPU_FIELDS = {
    "index": ("index", ""), "count": ("count", ""),
    "uuid": ("uuid", ""), "gpu_uuid": ("uuid", ""),
    "name": ("name", ""), "gpu_name": ("name", ""),
    "driver_version": ("driver_version", ""),
    "pci.bus_id": ("pci.bus_id", ""), "gpu_bus_id": ("pci.bus_id", ""),
    "memory.total": ("memory.total", "MiB"), "memory.used": ("memory.used", "MiB"),
    "memory.free": ("memory.free", "MiB"), "utilization.gpu": ("utilization.gpu", "%"),
    # health counters (fleet doctor), each from the GPU's state key of the same meaning
    **{f: (f, "") for f in (
        "ecc.errors.uncorrected.volatile.total", "ecc.errors.corrected.volatile.total",
        "retired_pages.pending", "retired_pages.double_bit.count",
        "clocks_throttle_reasons.active", "pcie.link.gen.current", "pcie.link.gen.max",
        "pcie.link.width.current", "pcie.link.width.max")},
}
# state key -> (the field it answers, its value on a healthy GPU)
HEALTH = {"ecc_uncorrected": ("ecc.errors.uncorrected.volatile.total", 0),
          "ecc_corrected": ("ecc.errors.corrected.volatile.total", 0),
          "retired_pending": ("retired_pages.pending", "No"),
          "retired_double": ("retired_pages.double_bit.count", 0),
          "throttle": ("clocks_throttle_reasons.active", "0x0000000000000000"),
          "pcie_gen": ("pcie.link.gen.current", 4), "pcie_gen_max": ("pcie.link.gen.max", 4),
          "pcie_width": ("pcie.link.width.current", 16),
          "pcie_width_max": ("pcie.link.width.max", 16)}
APP_FIELDS = {
    "gpu_uuid": ("gpu_uuid", ""), "gpu_name": ("gpu_name", ""),
    "gpu_bus_id": ("gpu_bus_id", ""), "pid": ("pid", ""),
    "process_name": ("process_name", ""), "name": ("process_name", ""),
    "used_memory": ("used_gpu_memory", "MiB"), "used_gpu_memory": ("used_gpu_memory", "MiB"),
}


class Refusal(Exception):
    """What the real program would print instead of an answer, and its exit code."""

    def __init__(self, text: str, code: int) -> None:
        super().__init__(text)
        self.text, self.code = text, code


def default_uuid(index: int) -> str:
    h = hashlib.sha256(f"fleet-testbed-gpu-{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def alive(pid: int) -> bool:
    """The process exists here and is not a zombie (as NVML no longer lists a dead one)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def process_name(pid: int) -> str:
    """What nvidia-smi shows as a process's name: its argv[0], else its comm."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0")[0].decode(errors="replace")
        if argv0:
            return argv0
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "[Not Found]"


def gpus_of(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Every GPU with its live apps and what they make of its memory and utilization."""
    driver = str(state.get("driver") or DRIVER)
    out = []
    for i, g in enumerate(state.get("gpus") or []):
        apps = [a for a in state.get("apps") or [] if int(a["gpu"]) == i and alive(int(a["pid"]))]
        total = int(g.get("memory_total_mib", 81559))
        used = sum(int(a["used_mib"]) for a in apps)
        out.append({
            "index": str(i), "uuid": str(g.get("uuid") or default_uuid(i)),
            "name": str(g.get("name", "NVIDIA H100 80GB HBM3")), "driver_version": driver,
            "pci.bus_id": f"00000000:{0x18 + i:02X}:00.0",
            "memory.total": str(total), "memory.used": str(used),
            "memory.free": str(max(total - used, 0)),
            "utilization.gpu": str(int(g.get("utilization", 0)) if apps else 0),
            "apps": apps,
            **{f: str(g.get(key, healthy)) for key, (f, healthy) in HEALTH.items()},
        })
    for g in out:
        g["count"] = str(len(out))
    return out


def table(fields: list[str], known: dict[str, tuple[str, str]], rows: list[dict[str, str]],
          header: bool, units: bool) -> str:
    for f in fields:
        if f not in known:
            raise Refusal(f'Field "{f}" is not a valid field to query.\n\n', EXIT_INVALID)
    lines = []
    if header:
        lines.append(", ".join(known[f][0] + (f" [{known[f][1]}]" if known[f][1] else "")
                               for f in fields))
    for row in rows:
        lines.append(", ".join(row[known[f][0]] + (f" {known[f][1]}" if units and known[f][1]
                                                   else "") for f in fields))
    return "".join(line + "\n" for line in lines)


def parse(argv: list[str]) -> dict[str, str]:
    """Options as the real program spells them: `--opt=value` or `--opt value`, `-i N`."""
    takes = {"-i": "id", "--id": "id", "--query-gpu": "query-gpu",
             "--query-compute-apps": "query-compute-apps", "--format": "format"}
    flags = {"-L": "list", "--list-gpus": "list"}
    opts: dict[str, str] = {}
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        key, eq, value = arg.partition("=")
        if key in takes:
            if not eq:
                if not rest:
                    raise Refusal(INVALID, EXIT_INVALID)
                value = rest.pop(0)
            opts[takes[key]] = value
        elif arg in flags:
            opts[flags[arg]] = ""
        else:
            raise Refusal(INVALID, EXIT_INVALID)
    return opts


def chosen(gpus: list[dict[str, Any]], ids: str | None) -> list[dict[str, Any]]:
    """The GPUs that -i names (an index, a UUID or a bus id; a comma list), or all."""
    if ids is None:
        return gpus
    wanted = [x.strip() for x in ids.split(",")]
    picked = [g for g in gpus if g["index"] in wanted or g["uuid"] in wanted
              or g["pci.bus_id"] in wanted]
    if len(picked) != len(wanted):
        raise Refusal(NO_DEVICES, EXIT_NOT_FOUND)
    return picked


def summary(gpus: list[dict[str, Any]], driver: str) -> str:
    """A short version of the plain `nvidia-smi` table."""
    rule = "+" + "-" * 77 + "+"

    def row(text: str) -> str:
        return f"| {text:<75.75} |"

    lines = [rule, row(f"NVIDIA-SMI {driver:<24} Driver Version: {driver}"), rule]
    for g in gpus:
        mem = f"{g['memory.used']}MiB / {g['memory.total']}MiB"
        lines.append(row(f"{g['index']:>3}  {g['name'][:28]:<28} {g['pci.bus_id']:<16} "
                         f"{mem:>19} {g['utilization.gpu']:>3}%"))
    lines += [rule, row("Processes:"), row(f" GPU        PID   {'Process name':<39} GPU Memory")]
    procs = [(g["index"], a) for g in gpus for a in g["apps"]]
    for index, a in procs:
        name = process_name(int(a["pid"]))[:39]
        lines.append(row(f"{index:>4} {int(a['pid']):>10}   {name:<39} "
                         f"{int(a['used_mib']):>7}MiB"))
    if not procs:
        lines.append(row(" No running processes found"))
    return "\n".join(lines + [rule]) + "\n"


def answer(argv: list[str], state: dict[str, Any]) -> str:
    fail = state.get("fail")
    driver = str(state.get("driver") or DRIVER)
    if fail == "no-driver":
        raise Refusal(NO_DRIVER + "\n", EXIT_NO_DRIVER)
    if fail == "version-mismatch":
        library = ".".join(driver.split(".")[:2])
        raise Refusal(f"{MISMATCH}\nNVML library version: {library}\n", EXIT_MISMATCH)
    opts = parse(argv)
    modes = [m for m in ("query-gpu", "query-compute-apps", "list") if m in opts]
    query = modes[0] if modes and modes[0] != "list" else None
    if len(modes) > 1 or ("format" in opts) != (query is not None):
        raise Refusal(INVALID, EXIT_INVALID)  # one mode at a time; --format with a query only
    gpus = gpus_of(state)
    if not gpus:
        raise Refusal(NO_DEVICES, EXIT_NOT_FOUND)
    gpus = chosen(gpus, opts.get("id"))
    if "list" in opts:
        return "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in gpus)
    if query is None:
        return summary(gpus, driver)
    fmt = [x.strip() for x in opts["format"].split(",")]
    if fmt[0] != "csv" or not set(fmt[1:]) <= {"noheader", "nounits"}:
        raise Refusal(INVALID, EXIT_INVALID)
    header, units = "noheader" not in fmt, "nounits" not in fmt
    if query == "query-gpu":
        fields = [f.strip() for f in opts["query-gpu"].split(",")]
        return table(fields, GPU_FIELDS, gpus, header, units)
    fields = [f.strip() for f in opts["query-compute-apps"].split(",")]
    rows = [{"gpu_uuid": g["uuid"], "gpu_name": g["name"], "gpu_bus_id": g["pci.bus_id"],
             "pid": str(int(a["pid"])), "process_name": process_name(int(a["pid"])),
             "used_gpu_memory": str(int(a["used_mib"]))} for g in gpus for a in g["apps"]]
    return table(fields, APP_FIELDS, rows, header, units)


def main(argv: list[str]) -> int:
    path = os.environ.get("TB_NVIDIA_SMI_STATE") or STATE
    try:
        with open(path) as f:
            state = json.load(f)
    except FileNotFoundError:
        state = {"gpus": []}
    try:
        sys.stdout.write(answer(argv, state))
    except Refusal as r:
        sys.stdout.write(r.text if r.text.endswith("\n") else r.text + "\n")
        return r.code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
