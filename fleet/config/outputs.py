"""A job's `outputs`: what `fleet pull` takes by default, paths under the job's directory on the
nodes; the same check for the paths `fleet pull` is given."""

from __future__ import annotations

from fleet.config.schema import Table


def output_path(text: str) -> str:
    """A path under the job's directory as a job file or `fleet pull` gives it (`runs/`,
    `checkpoints/last.pt`), without its trailing slashes. ValueError, saying why, for an
    absolute path, one with a `..`, `.` or empty part, or none at all."""
    if text.startswith("/"):
        raise ValueError(f"{text!r} is absolute: name a path under the job's directory")
    rel = text.rstrip("/")
    if not rel or "\0" in rel or any(p in ("", ".", "..") for p in rel.split("/")):
        raise ValueError(f"{text!r} must name a file or directory under the job's directory "
                         "(no '..', '.' or empty part)")
    return rel


def take_outputs(root: Table) -> tuple[str, ...]:
    """`outputs`: paths under the job's directory on the nodes, trailing slashes dropped."""
    found = []
    for i, text in enumerate(root.take_str_list("outputs", [])):
        try:
            found.append(output_path(text))
        except ValueError as e:
            raise root.error(f"outputs[{i}]", str(e)) from None
    return tuple(found)
