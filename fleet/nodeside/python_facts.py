"""What the node's python says of itself and of the node, for fleet's probe (fleet.facts.probe):
run by probe.sh with the node's own interpreter, standard library only, Python 3.8+.

Argv: MASTER [deep WORKDIR]. Prints one line, `py=` then a JSON object: the versions (without
importing torch: seconds saved per node), the installed packages (`pip freeze`'s name==version),
every address of every interface (getifaddrs through ctypes: no `ip` needed, IPv6 included),
and, given a MASTER, the source address the kernel would use towards it (a UDP connect sends
nothing). With `deep` (`fleet check`), also "check": what importing torch says (its version,
CUDA, GPUs), the driver and GPU processes, name resolution, the reverse lookup's time, and the
free space under WORKDIR.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import glob
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Any, Dict, Tuple  # noqa: UP035 - Python 3.8

Json = Dict[str, Any]  # noqa: UP006 - evaluated at run time, on Python 3.8 too


def versions(out: Json) -> None:
    """Python's, and torch's and accelerate's as installed (their metadata: no import)."""
    try:
        out["has_torch"] = importlib.util.find_spec("torch") is not None
    except Exception:  # a broken torch package: no torch
        out["has_torch"] = False
    have = installed()
    for name in ("torch", "accelerate"):
        if name in have:  # not installed: absent ("" for torch)
            out[name] = have[name][1]
    for key, pattern in (("nccl", "nvidia_nccl_cu*-*.dist-info"),
                         ("cuda", "nvidia_cuda_runtime*-*.dist-info")):
        for d in sys.path:
            found = glob.glob(os.path.join(d or ".", pattern))
            if found:
                out[key] = os.path.basename(found[0])[:-len(".dist-info")].split("-")[1]
                break


def installed() -> Dict[str, Tuple[str, str]]:  # noqa: UP006 - Python 3.8
    """(Name, Version) of each distribution on sys.path by its normalised name, the first of a
    name where several are (the one imported), as importlib.metadata finds them (a
    directory's *.dist-info, then its *.egg-info), read from their headers alone: parsing
    every METADATA whole took a tenth of a second of each node's CPU per launch."""
    seen: Dict[str, Tuple[str, str]] = {}  # noqa: UP006 - Python 3.8
    for d in sys.path:
        try:
            names = sorted(os.listdir(d or "."))
        except OSError:  # not a directory (a zip), or gone
            continue
        infos = [(n, "METADATA") for n in names if n.endswith(".dist-info")]
        infos += [(n, "PKG-INFO") for n in names if n.endswith(".egg-info")]
        for n, meta in infos:
            head = _headers(os.path.join(d or ".", n, meta))
            name, ver = head.get("name", ""), head.get("version", "")
            key = name.lower().replace("_", "-").replace(".", "-")
            if name and key not in seen:
                seen[key] = (name, ver)
    return seen


def _headers(path: str) -> Dict[str, str]:  # noqa: UP006 - Python 3.8
    """A metadata file's Name and Version (its header lines, before the first blank one)."""
    out: Dict[str, str] = {}  # noqa: UP006 - Python 3.8
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break
                key, sep, value = line.partition(":")
                if sep and key.lower() in ("name", "version") and key.lower() not in out:
                    out[key.lower()] = value.strip()
                    if len(out) == 2:
                        break
    except OSError:
        pass
    return out


def packages(out: Json) -> None:
    """What this interpreter has installed, as `pip freeze` names it: name==version of each
    distribution on sys.path, the first of a name where several are (the one imported)."""
    seen: Dict[str, str] = {}  # noqa: UP006 - Python 3.8
    try:
        for key, (name, ver) in installed().items():
            seen[key] = f"{name}=={ver}"
    except Exception as e:  # a broken distribution's metadata: the rest is still said
        out["packages_error"] = f"{type(e).__name__}: {e}"
    out["packages"] = [seen[k] for k in sorted(seen)]


class SockAddr(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("data", ctypes.c_ubyte * 26)]


class IfAddrs(ctypes.Structure):
    pass


IfAddrs._fields_ = [("next", ctypes.POINTER(IfAddrs)), ("name", ctypes.c_char_p),
                    ("flags", ctypes.c_uint), ("addr", ctypes.POINTER(SockAddr)),
                    ("netmask", ctypes.POINTER(SockAddr)), ("dst", ctypes.c_void_p),
                    ("data", ctypes.c_void_p)]


def addresses(out: Json) -> None:
    """[interface, IP] of every IPv4 and IPv6 address, from libc's getifaddrs."""
    found: list[list[str]] = []
    out["addrs"] = found
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        head = ctypes.POINTER(IfAddrs)()
        if libc.getifaddrs(ctypes.byref(head)) != 0:
            return
        p = head
        while p:
            a = p.contents.addr
            if a and a.contents.family in (socket.AF_INET, socket.AF_INET6):
                family = a.contents.family
                raw = bytes(a.contents.data)
                ip = socket.inet_ntop(family, raw[2:6] if family == socket.AF_INET else raw[6:22])
                found.append([p.contents.name.decode(), ip])
            p = p.contents.next
        libc.freeifaddrs(head)
    except Exception as e:
        out["addrs_error"] = str(e)


def route(out: Json, dest: str) -> None:
    try:
        s = socket.socket(socket.AF_INET6 if ":" in dest else socket.AF_INET, socket.SOCK_DGRAM)
        s.connect((dest, 9))
        out["route_src"] = s.getsockname()[0]
    except OSError as e:
        out["route_error"] = str(e)


def _run(argv: list[str]) -> list[str]:
    q = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    return [line for line in q.stdout.strip().splitlines() if line.strip()]


def check(workdir: str, own: str) -> Json:
    """What `fleet check` asks beyond the plan's facts: torch as it imports (the installed
    wheel's metadata may say otherwise), GPUs, names, the reverse lookup of `own` (an address of
    this node), the free space under the workdir."""
    out: Json = {}
    try:
        import torch
        out["torch"] = torch.__version__
        out["cuda_available"] = torch.cuda.is_available()
        out["gpus"] = torch.cuda.device_count() if out["cuda_available"] else 0
        out["cuda"] = torch.version.cuda or ""
        nccl: Any = torch.cuda.nccl  # untyped in torch
        try:
            out["nccl"] = ".".join(map(str, nccl.version())) if out["gpus"] else ""
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
        driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        out["driver"] = driver[0].strip() if driver else ""
        out["gpu_processes"] = _run(["nvidia-smi",
                                     "--query-compute-apps=pid,process_name,used_memory",
                                     "--format=csv,noheader"])
    try:
        name = socket.gethostname()
        out["hostname_resolves"] = sorted({str(a[4][0]) for a in socket.getaddrinfo(name, None)})
    except OSError as e:
        out["hostname_resolves"] = []
        out["hostname_error"] = str(e)
    t0 = time.monotonic()
    if own:
        with contextlib.suppress(OSError):
            socket.gethostbyaddr(own)
    out["reverse_dns_s"] = time.monotonic() - t0
    path = os.path.expanduser(workdir)
    while not os.path.exists(path):
        path = os.path.dirname(path) or "/"
    out["disk_free"] = shutil.disk_usage(path).free
    out["disk_path"] = path
    return out


def main(argv: list[str]) -> int:
    out: Json = {"python": sys.version.split()[0], "torch": "", "has_torch": False}
    versions(out)
    packages(out)
    addresses(out)
    if argv and argv[0]:
        route(out, argv[0])
    deep = argv[1:2] == ["deep"]
    if deep:
        # The address this node reaches the master from, else the one its SSH server answers on.
        ssh = os.environ.get("SSH_CONNECTION", "").split()
        own = out.get("route_src") or (ssh[2] if len(ssh) >= 3 else "")
        out["check"] = check(argv[2] if len(argv) > 2 else "~", str(own))
    sys.stdout.write("py=" + json.dumps(out) + "\n")
    sys.stdout.flush()
    if deep:
        os._exit(0)  # now: an interpreter that imported torch takes a second to tear down
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
