"""Which files of a workdir are left out of the sync by `.gitignore` and `.fleetignore`: in a git
work tree git's own answer (`git ls-files --ignored`: nested .gitignore files, .git/info/exclude
and the user's global excludes, tracked files never ignored), elsewhere the .gitignore files
read with pathspec's gitwildmatch; then the workdir's `.fleetignore`, same syntax, whose `!`
lines also send a file .gitignore leaves out. Whatever they say, a TOML file that holds a
`[notify]` (a job file, a fleet config file) is never sent: its webhook stays on this machine,
and neither is a folder that `fleet pull` wrote into (it holds PULLED): results brought back
from the nodes are never sent to every node again."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from pathspec import GitIgnoreSpec

from fleet.config.notify import holds_notify

GITIGNORE, FLEETIGNORE = ".gitignore", ".fleetignore"
NOTIFY = "[notify]"  # what leaves out a file that holds one (keeps_notify)
PULLED = ".fleet-pulled"  # the mark `fleet pull` leaves in its destination (mark_pulled)


def spec_of(text: str) -> GitIgnoreSpec:
    return GitIgnoreSpec.from_lines(text.splitlines())


def parse_git_ignored(out: str) -> frozenset[str]:
    """`git ls-files -z --others --ignored --exclude-standard --directory` run in the workdir:
    NUL-separated paths relative to it, an ignored directory with a trailing '/'. The workdir
    itself (`./`, where all of it is ignored in its repository) is not one of them: it was
    named as the job's workdir, so what is in it is judged file by file by .fleetignore."""
    return frozenset(p for p in out.split("\0") if p and p not in ("./", "."))


def git_ignored(root: Path) -> frozenset[str] | None:
    """What git ignores under root, or None where root is not in a git work tree (or git is
    not installed, or refuses the repository)."""
    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)

    try:
        inside = git("rev-parse", "--is-inside-work-tree")
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        listed = git("ls-files", "-z", "--others", "--ignored", "--exclude-standard",
                     "--directory")
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_git_ignored(listed.stdout) if listed.returncode == 0 else None


@dataclass
class Ignores:
    """The rules for one workdir. `git`: git's ignored paths (None: judge by the .gitignore
    files, read as the walk reaches each directory); `fleet`: the root's .fleetignore."""

    root: Path
    git: frozenset[str] | None
    fleet: GitIgnoreSpec | None
    _specs: dict[str, GitIgnoreSpec | None] = field(default_factory=dict)

    @property
    def reincludes(self) -> bool:
        """.fleetignore has `!` lines: a directory .gitignore leaves out may hold a file to send."""
        return self.fleet is not None and any(p.include is False for p in self.fleet.patterns)

    def why(self, rel: str, is_dir: bool) -> str | None:
        """The file that leaves this path out (GITIGNORE or FLEETIGNORE), or None: it is sent."""
        name = rel + "/" if is_dir else rel
        if self.fleet is not None:
            said = self.fleet.check_file(name).include
            if said is not None:
                return FLEETIGNORE if said else None
        return GITIGNORE if self._gitignored(rel, is_dir) else None

    def _gitignored(self, rel: str, is_dir: bool) -> bool:
        parts = rel.split("/")
        if self.git is not None:
            # A directory git ignores whole is listed alone (a link to one, as a file); its
            # files are ignored with it.
            return rel in self.git or (is_dir and rel + "/" in self.git) or any(
                "/".join(parts[:i]) + "/" in self.git for i in range(1, len(parts)))
        # The deepest .gitignore with a matching line decides, as in git.
        for i in range(len(parts) - 1, -1, -1):
            spec = self._spec("/".join(parts[:i]))
            if spec is None:
                continue
            said = spec.check_file("/".join(parts[i:]) + ("/" if is_dir else "")).include
            if said is not None:
                return said
        return False

    def _spec(self, rel_dir: str) -> GitIgnoreSpec | None:
        if rel_dir not in self._specs:
            self._specs[rel_dir] = _read_spec(self.root / rel_dir / GITIGNORE)
        return self._specs[rel_dir]


def _read_spec(path: Path) -> GitIgnoreSpec | None:
    try:
        return spec_of(path.read_text(errors="replace"))
    except OSError:  # none there (or unreadable: the scan names unreadable files itself)
        return None


def keeps_notify(rel: str, path: str) -> bool:
    """Whether the workdir's file `rel` (read at `path`) stays on this machine for the
    `[notify]` it holds (a `.toml` file only: job files and fleet's config are; one that
    cannot be read is left to the scan, which names it)."""
    if not rel.lower().endswith(".toml"):
        return False
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return holds_notify(f.read())
    except OSError:
        return False


def mark_pulled(dest: Path, run_id: str) -> None:
    """Mark dest as `fleet pull`'s, as a CACHEDIR.TAG marks a cache: a sync that meets the mark
    in a folder (below its root) leaves the folder out, wherever the user moved it. Written
    before anything is fetched, so that even an interrupted pull's partial files stay here;
    never through a link, and left as it is where a pull already wrote it."""
    dest.mkdir(parents=True, exist_ok=True)
    text = (f"fleet pull wrote run {run_id}'s outputs here. fleet up never syncs a folder that "
            f"holds this file\n(except the job's workdir itself); delete it to sync this "
            "folder again.\n")
    try:
        fd = os.open(dest / PULLED, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        if not os.path.islink(dest / PULLED):
            return  # an earlier pull's: left as it is, as every file already here
        raise
    with os.fdopen(fd, "w") as f:
        f.write(text)


def ignores(root: Path) -> Ignores:
    """The rules for the workdir `root` (one git call where it is in a work tree)."""
    return Ignores(root, git_ignored(root), _read_spec(root / FLEETIGNORE))


def needed(ignored: tuple[tuple[str, str], ...], rels: tuple[str, ...]) -> list[tuple[str, str]]:
    """The files among rels (the job's script, its setup's inputs) that an ignore file leaves
    out, with that file: the job could not run without them."""
    why = dict(ignored)

    def left_out(rel: str) -> str | None:
        parts = rel.split("/")
        return why.get(rel) or next((why[d] for i in range(1, len(parts))
                                     if (d := "/".join(parts[:i]) + "/") in why), None)

    return [(rel, w) for rel in rels if (w := left_out(rel)) is not None]


def counted(ignored: tuple[tuple[str, str], ...]) -> list[tuple[str, list[str]]]:
    """Ignored paths grouped by the file (or table) that ignores them: .gitignore's first."""
    return [(why, names) for why in (GITIGNORE, FLEETIGNORE, NOTIFY, PULLED)
            if (names := [rel for rel, w in ignored if w == why])]


def summary(ignored: tuple[tuple[str, str], ...]) -> str:
    """`7 path(s) by .gitignore, 1 by .fleetignore` (an ignored directory is one path)."""
    return ", ".join(f"{len(names)}{' path(s)' if i == 0 else ''} by {why}"
                     for i, (why, names) in enumerate(counted(ignored)))
