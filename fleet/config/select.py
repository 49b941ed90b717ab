"""`--node NODE` and `--exclude NODE` (each repeatable, on every command that takes a job): the
hosts of an inventory that a command works on, in the inventory's order, so that the first one
left is the master. Spares stay spares: one that is left out is never taken in a restart."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from fleet.config.inventory import BackendKind, Host, Inventory, backend_kind, load_inventory
from fleet.errors import UsageError


@dataclass(frozen=True)
class Selection:
    """The hosts named on the command line: only these (`--node`), or all but these
    (`--exclude`); both may be given, and `--exclude` wins."""

    node: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.node or self.exclude)

    def keeps(self, name: str) -> bool:
        return (not self.node or name in self.node) and name not in self.exclude

    def words(self) -> str:
        """As it was typed: `--node a --exclude b`."""
        return " ".join([*(f"--node {n}" for n in self.node),
                         *(f"--exclude {n}" for n in self.exclude)])


def check(inventory: Inventory, sel: Selection) -> None:
    """UsageError where a name is none of the inventory's hosts (nor spares)."""
    names = [h.name for h in inventory.every_host]
    for flag, given in (("--node", sel.node), ("--exclude", sel.exclude)):
        unknown = [n for n in dict.fromkeys(given) if n not in names]
        if unknown:
            raise UsageError(f"{flag}: no host named {', '.join(unknown)} in "
                             f"{inventory.path}; its hosts: {', '.join(names)}")


def narrowed(inventory: Inventory, sel: Selection) -> Inventory:
    """The hosts and spares kept, whichever are left (`fleet exec`, `trust`: spares are hosts a
    job may come to use)."""
    check(inventory, sel)
    return dataclasses.replace(
        inventory, hosts=tuple(h for h in inventory.hosts if sel.keeps(h.name)),
        spares=tuple(h for h in inventory.spares if sel.keeps(h.name)))


def hosts(inventory: Inventory, sel: Selection) -> list[Host]:
    """Every host kept, spares too, in the inventory's order."""
    return list(narrowed(inventory, sel).every_host)


def selected(inventory: Inventory, sel: Selection) -> Inventory:
    """The inventory with only the hosts kept, to run a job on: UsageError where none is left
    (spares start nothing)."""
    if not sel:
        return inventory
    check(inventory, sel)
    kept = tuple(h for h in inventory.hosts if sel.keeps(h.name))
    if not kept:
        spares = [h.name for h in inventory.spares if sel.keeps(h.name)]
        raise UsageError(
            f"{sel.words()} leaves no host of {inventory.path} to run the job on (its hosts: "
            f"{', '.join(h.name for h in inventory.hosts)})"
            + (f"; {', '.join(spares)} only replace a host in a restart" if spares else ""))
    return dataclasses.replace(inventory, hosts=kept, spares=tuple(
        h for h in inventory.spares if sel.keeps(h.name)))


def load_selected(path: Path, sel: Selection) -> Inventory:
    """The inventory file's hosts that `sel` keeps (fleet.config.inventory.load_inventory)."""
    return selected(load_inventory(path), sel)


def validate(path: Path, sel: Selection) -> None:
    """Before anything is connected to: the names are the inventory's, and a host is left.
    A Slurm cluster has no host list to choose from."""
    if not sel:
        return
    if backend_kind(path) is BackendKind.SLURM:
        raise UsageError(f"{sel.words()}: {path} is a Slurm cluster, whose nodes Slurm "
                         "chooses; --node and --exclude choose among a host list's hosts")
    load_selected(path, sel)
