"""Words that are quick to read: the same error on several hosts said once, naming them; sizes
in binary units; a copy sent to N nodes said once, not summed."""

from __future__ import annotations

import io

from fleet.backends.checks import Check, Status, same_once, view
from fleet.console import Console
from fleet.errors import CommandTimedOut, HostError, host_error, said_once
from fleet.sizes import human, sent_to, short


def test_the_same_error_and_fix_on_three_hosts_is_said_once_naming_them() -> None:
    same = "port 29500 is taken; fix: stop what listens there"
    e = HostError("preflight", {"node1": same, "node2": same, "node3": same,
                                "node4": "disk full"})
    assert str(e) == ("preflight failed on 4 host(s); nothing was started:\n"
                      f"  node1, node2, node3: {same}\n  node4: disk full")
    assert e.failures["node2"] == same  # the data keeps every host


def test_a_reason_that_names_its_own_host_groups_without_the_name() -> None:
    e = host_error("probe", {n: CommandTimedOut(n, "the probe", 30) for n in ("n1", "n2")})
    assert str(e).splitlines()[1] == "  n1, n2: no answer to the probe after 30s"
    assert said_once({"a": "x", "b": "y", "c": "x"}) == [(["a", "c"], "x"), (["b"], "y")]


def test_check_rows_that_say_the_same_on_several_hosts_are_one_row() -> None:
    fail = [Check(h, "torch", Status.FAIL, "missing", "install torch") for h in ("a", "b", "c")]
    rows = same_once([*fail, Check("d", "torch", Status.FAIL, "2.1 here", "same version")])
    assert [r.host for r in rows] == ["a, b, c", "d"]
    shown = view(Console(out=io.StringIO(), err=io.StringIO(), color=False, live=False),
                 [*fail, Check("a", "ssh", Status.PASS, "ok")])
    assert shown.count("fix: install torch") == 1 and "a, b, c" in shown


def test_sizes_are_human_and_a_copy_to_n_nodes_is_said_once() -> None:
    assert human(314572800) == "300.0 MiB" and short(314572800) == "300 MiB"
    assert (human(5), human(1536), human(3 << 40)) == ("5 bytes", "1.5 KiB", "3.0 TiB")
    mib = 300 << 20
    assert sent_to("data", {"n1": mib, "n2": mib, "n3": mib}) == "data: 300 MiB sent to 3 nodes"
    assert sent_to("code", {"n1": mib, "n2": 1 << 20}) == ("code: up to 300 MiB sent to each "
                                                          "of 2 of 2 nodes")
    assert sent_to("code", {"n1": mib}) is None and sent_to("code", {"a": 0, "b": 0}) is None
