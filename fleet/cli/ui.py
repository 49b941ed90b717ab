"""`fleet ui`: the lab's page in a browser, served from this machine (fleet.ui)."""

from __future__ import annotations

import ipaddress
import secrets
import socket
import sys
from pathlib import Path
from typing import Annotated

import typer

from fleet.cli.app import echo
from fleet.errors import UsageError

DEFAULT_PORT = 8471


def ui(port: Annotated[int, typer.Option(
           "--port", min=0, max=65535, help="The port to serve on (0: any free one).")
           ] = DEFAULT_PORT,
       inventory: Annotated[list[Path] | None, typer.Option(
           "--inventory", "-i", metavar="INVENTORY",
           help="An inventory whose hosts the lab page shows (give -i again for more); "
                "default: those the runs recorded here ran on.")
           ] = None,
       listen: Annotated[str, typer.Option(
           "--listen", metavar="ADDRESS",
           help="The address to serve on; anything but loopback lets others on the network "
                "reach the page (with the token).")] = "127.0.0.1",
       open_: Annotated[bool, typer.Option("--open", help="Open the page in a browser.")
                        ] = False,
       ) -> None:
    """Serve the lab's page in a browser: GPUs, runs, live logs.

    Nothing to install on the hosts and no daemon: the page lives as long as this command. It
    prints its URL with a token (as Jupyter does); a request without the token is refused.
    Ctrl-C ends it."""
    import uvicorn

    from fleet.ui.server import Ui, make_app

    try:
        address = ipaddress.ip_address(listen)
    except ValueError:
        raise UsageError(f"--listen {listen!r}: an IP address (127.0.0.1, ::1, 0.0.0.0)"
                         ) from None
    for inv in inventory or []:
        if not inv.is_file():
            raise UsageError(f"--inventory {inv}: file not found")
    if not address.is_loopback:
        echo(f"warning: serving on {listen}: anyone who reaches this machine there and has the "
             "token can see the lab and stop runs", err=True)
    sock = socket.socket(socket.AF_INET6 if address.version == 6 else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((listen, port))
    except OSError as e:
        sock.close()
        raise UsageError(f"cannot serve on {listen}:{port}: {e.strerror} (--port 0 takes a "
                         "free port)") from None
    sock.listen(64)
    token = secrets.token_urlsafe(24)
    from fleet.ui.data import recorded_inventories

    shown_invs = [p.resolve() for p in inventory] if inventory else recorded_inventories()
    app = make_app(Ui(token, shown_invs, Path.cwd()))
    shown = f"[{listen}]" if address.version == 6 else listen
    url = f"http://{shown}:{sock.getsockname()[1]}/?token={token}"
    echo(f"fleet ui: {url}")
    sys.stdout.flush()  # the one line a script waits for
    if open_:
        import webbrowser

        webbrowser.open(url)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=2, lifespan="on"))
    server.run(sockets=[sock])
