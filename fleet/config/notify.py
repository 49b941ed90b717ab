"""`[notify]`: word when a run ends (a webhook, a local command), from the job file or the user's
own config file ($XDG_CONFIG_HOME/fleet/config.toml); a job's `[notify]` replaces the user's.
Both stay on this machine: a file that holds one is never synced (holds_notify), and a detached
run's master gets the webhook only where `from_master = true` asks for it."""

from __future__ import annotations

import os
import re
import tomllib
import urllib.parse
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from fleet.config.schema import Table, load_toml


class Format(StrEnum):
    """How the webhook's POST body is written."""

    SLACK = "slack"  # JSON {"text": message}: Slack's incoming webhooks, and most chat hooks
    NTFY = "ntfy"  # the message as plain text to an ntfy topic URL, its headline as the Title
    JSON = "json"  # {"text": message} and every field of the notice: a receiver of one's own


@dataclass(frozen=True)
class Notify:
    """Where word of a run's end goes; nothing where both are empty."""

    webhook: str | None = None
    format: Format = Format.SLACK
    command: tuple[str, ...] = ()
    source: str = ""  # the file it was read from, for the words that name it
    # A detached run's master may hold the webhook, to tell of the run's end without fleet.
    from_master: bool = False

    @property
    def wanted(self) -> bool:
        return self.webhook is not None or bool(self.command)

    def view(self) -> dict[str, object]:
        """What the manifest and `fleet show` keep of it: the webhook never whole, the
        command's program without its arguments (a token may be one; the manifest is copied
        to every node's run directory)."""
        return {"webhook": redact(self.webhook) if self.webhook else None,
                "format": self.format.value,
                "command": [*self.command[:1], *("***" for _ in self.command[1:])],
                "from_master": self.from_master}


def redact(url: str) -> str:
    """A webhook URL as fleet prints it: its scheme and host only (its path and query often are
    the secret: a Slack hook's token, an ntfy topic)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or "?"
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}/..."


def user_config() -> Path:
    """The user's own fleet config file (XDG's base directories)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(Path.home(), ".config")
    return Path(base) / "fleet" / "config.toml"


def take_notify(t: Table) -> Notify:
    """A `[notify]` table, every mistake named by its key."""
    webhook = t.take("webhook", str, None)
    if webhook is not None:
        parts = urllib.parse.urlsplit(webhook)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            # The value is not printed: it may hold a token.
            raise t.error("webhook", "must be an http:// or https:// URL with a host")
        if any(c.isspace() for c in webhook):
            raise t.error("webhook", "must not contain spaces or line breaks")
    text = t.take("format", str, Format.SLACK.value)
    try:
        fmt = Format(text)
    except ValueError:
        words = ", ".join(f.value for f in Format)
        raise t.error("format", f"must be one of {words}, not {text!r}") from None
    if t.has("format") and webhook is None:
        raise t.error("format", "only used with webhook")
    from_master = t.take("from_master", bool, False)
    if t.has("from_master") and webhook is None:
        raise t.error("from_master", "only used with webhook")
    command = tuple(t.take_str_list("command", []))
    if t.has("command") and (not command or not command[0]):
        raise t.error("command", "must name a program (leave it out for no command)")
    t.done()
    return Notify(webhook, fmt, command, str(t.path), from_master)


# A line that begins a notify table or key, in text that is not TOML (it may be read as such).
_NOTIFY_LINE = re.compile(r"""^\s*(\[+\s*)?["']?notify\b""", re.M)


def holds_notify(text: str) -> bool:
    """Whether a file's text (a job file, a fleet config file) holds a `[notify]` that says
    where word goes: its webhook is a secret, and its command is this machine's, so the file is
    not synced to the nodes. Text that is not valid TOML holds one where a line begins a
    notify table or key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return _NOTIFY_LINE.search(text) is not None
    return bool(data.get("notify"))


def job_notify(root: Table) -> Notify:
    """The job's `[notify]`; without one, the user's config file's, where it has one."""
    if root.has("notify"):
        return take_notify(root.table("notify"))
    path = user_config()
    if not path.is_file():
        return Notify()
    user = Table(path, load_toml(path, "fleet config"))
    found = take_notify(user.table("notify")) if user.has("notify") else Notify()
    user.done()
    return found
