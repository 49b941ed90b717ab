"""`python -m fleet`: the same as the `fleet` command."""

from fleet.cli import program

program()
