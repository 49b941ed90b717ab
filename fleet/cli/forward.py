"""`fleet forward`: a port on a run's node reached from this machine's 127.0.0.1, through fleet's
own connection, until Ctrl-C."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from fleet.cli.app import echo
from fleet.errors import Interrupted, UsageError

if TYPE_CHECKING:
    from fleet.config.schema import PortSpec

WAIT_TICK_S = 0.5


def split_args(words: list[str]) -> tuple[str | None, PortSpec]:
    """`[RUN] PORT[:LOCALPORT]` as (run, spec)."""
    from fleet.config.schema import parse_port_spec

    if not 1 <= len(words) <= 2:
        raise UsageError("give [RUN] PORT[:LOCALPORT], e.g. `fleet forward 6006` or "
                         "`fleet forward mnist-49b0 8888:18888`")
    try:
        spec = parse_port_spec(words[-1])
    except ValueError as e:
        raise UsageError(str(e)) from None
    return (words[0] if len(words) == 2 else None), spec


def forward(words: Annotated[list[str], typer.Argument(
                metavar="[RUN] PORT[:LOCALPORT]",
                help="The run (default: the latest), the port on the node, and the port here "
                     "(default: a free one).")],
            node: Annotated[str | None, typer.Option(
                "--node", help="The node whose port it is (default: the master).")] = None,
            ) -> None:
    """Reach a port on a run's node from here, until Ctrl-C.

    Through fleet's own SSH connection; the node connects to the port on its own 127.0.0.1.
    Listens on 127.0.0.1 here only and prints the URL; Ctrl-C ends it (exit 130)."""
    from fleet import backends
    from fleet.console import Console
    from fleet.run import record as state
    from fleet.transport.forward import forwarding

    run_id, spec = split_args(words)
    rec = state.load(run_id)
    console = Console()
    tunnel = backends.for_record(rec).tunnel(rec, node)
    try:
        with forwarding(tunnel, (spec,), console) as forwards:
            echo(forwards[0].url)
            console.info("Ctrl-C ends the forward (the run goes on)")
            while not forwards[0].ended.wait(WAIT_TICK_S):
                pass
            lost = forwards[0].lost
            assert lost is not None  # only a lost connection ends it before Ctrl-C
            raise lost
    except Interrupted as e:
        raise Interrupted(e.signame, f"the forward to {tunnel.node}:{spec.port} was closed "
                                     "(the run goes on)") from None
    finally:
        tunnel.transport.close()
