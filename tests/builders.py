"""Builders for the files a test writes by hand: job and inventory TOML (host lists and Slurm
clusters), with values written as TOML and the job's script beside it, so that a test says only
what it is about (`job(tmp, nproc_per_node=2)`, `hosts(tmp, "a", "b")`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

TWO_HOSTS = {"a": "10.0.0.1", "b": "10.0.0.2"}


def toml(value: object) -> str:
    """A value as TOML: strings quoted and escaped, booleans, numbers, lists and inline tables."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{toml(str(k))} = {toml(v)}" for k, v in value.items()) + " }"
    return str(value)


def table(keys: Mapping[str, object]) -> str:
    return "".join(f"{k} = {toml(v)}\n" for k, v in keys.items())


def hosts_toml(hosts: Mapping[str, str] | None = None,
               per_host: Mapping[str, Mapping[str, object]] | None = None,
               defaults: Mapping[str, object] | None = None) -> str:
    """A host list: `[defaults]` (if any), then one `[[hosts]]` per name -> address, in order,
    with that host's own keys from `per_host`."""
    text = f"[defaults]\n{table(defaults)}" if defaults else ""
    for name, address in (TWO_HOSTS if hosts is None else hosts).items():
        text += f'[[hosts]]\nname = {toml(name)}\naddress = {toml(address)}\n'
        text += table((per_host or {}).get(name, {}))
    return text


def write_hosts(path: Path, hosts: Mapping[str, str] | None = None, *,
                per_host: Mapping[str, Mapping[str, object]] | None = None,
                defaults: Mapping[str, object] | None = None) -> Path:
    """An inventory of hosts (a and b at 10.0.0.1-2 unless given), written at `path`."""
    path.write_text(hosts_toml(hosts, per_host, defaults))
    return path


def write_cluster(path: Path, body: str = "", **slurm: object) -> Path:
    """A Slurm cluster inventory: `[slurm]` with login localhost and 2 nodes unless given, then
    `body` as it is."""
    path.write_text("[slurm]\n" + table({"login": "localhost", "nodes": 2, **slurm}) + body)
    return path


def write_job(folder: Path, body: str = "", *, inventory: str = "inv.toml",
              script: str = "train.py", name: str = "job.toml",
              script_text: str | None = "print('hi')\n", **keys: object) -> Path:
    """A job file in `folder` naming `inventory` and `script` (written with `script_text`
    unless None), then `keys` as TOML, then `body` as it is (tables, or a mistake on
    purpose)."""
    if script_text is not None:
        (folder / script).write_text(script_text)
    path = folder / name
    path.write_text(table({"inventory": inventory, "script": script, **keys}) + body)
    return path
