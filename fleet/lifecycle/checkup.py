"""`[doctor] before` in a job: `fleet doctor` (quick or full) on the job's hosts before `up`
starts anything, where a host it names stops the launch with the doctor's line; and with
`[restart]`, before each later attempt, where a host it names gives way to a free spare (a
spare it names is never taken)."""

from __future__ import annotations

from fleet.backends.base import Backend
from fleet.config.job import Job
from fleet.console import Console, Meaning
from fleet.doctor.verdict import Finding, judge
from fleet.errors import ConfigError, HostError, HostsUnreachable


def look(backend: Backend, job: Job, console: Console, why: str
         ) -> tuple[list[Finding], dict[str, str]]:
    """The doctor's findings on the job's hosts (its spares too), and the hosts it could not
    examine."""
    form = "--quick" if job.doctor_before == "quick" else "(full)"
    console.info(f"[doctor] before {why}: fleet doctor {form} on the job's hosts")
    with console.waiting(f"fleet doctor before {why}") as w:
        exam = backend.doctor(job.inventory, job.selection, job.doctor_before == "quick",
                              w.update)
    return judge(exam, exam.bounds), exam.unreached


def spares_of(backend: Backend, job: Job) -> set[str]:
    try:
        return set(backend.spares(job.inventory))
    except ConfigError:
        return set()


def by_host(findings: list[Finding]) -> dict[str, str]:
    """Per host named, its lines (a slow link that pins no host: under "links")."""
    out: dict[str, list[str]] = {}
    for f in findings:
        out.setdefault(f.host or "links", []).append(f.line)
    return {h: "; ".join(lines) for h, lines in out.items()}


def before_up(backend: Backend, job: Job, console: Console) -> None:
    """Nothing where the job has no `[doctor] before`; else HostError (exit 5) with the
    doctor's lines where it names a host the run would start on, or a slow link; a spare it
    names is said, and left for a restart not to take."""
    if not job.doctor_before:
        return
    findings, unreached = look(backend, job, console, "the launch")
    spares = spares_of(backend, job)
    named = by_host(findings)
    for spare in sorted(spares & set(named)):
        console.info(f"[doctor] spare {named.pop(spare)}", Meaning.WARN)
    for spare in sorted(spares & set(unreached)):
        console.info(f"[doctor] spare {spare} not examined: {unreached.pop(spare)}",
                     Meaning.WARN)
    if named:
        raise HostError("fleet doctor before the launch", named)
    if unreached:
        raise HostsUnreachable("fleet doctor before the launch", unreached)
    console.info("fleet doctor: every host and link within bounds", Meaning.OK)


def before_attempt(backend: Backend, job: Job, console: Console, number: int
                   ) -> dict[str, str]:
    """Before a later attempt: every host the doctor names (spares too), with its lines;
    nothing where the job has no `[doctor] before`."""
    if not job.doctor_before:
        return {}
    findings, _ = look(backend, job, console, f"attempt {number}")
    named = by_host(findings)
    named.pop("links", None)  # a link that pins no host replaces no host
    return named
