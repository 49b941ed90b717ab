"""The page's static files (fleet/ui/static): no way for node text to become markup or code, no
inline script (the server's Content-Security-Policy forbids it), every DOM hook the browser
tests use present, the vendored plotting library shipped with its licence."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

STATIC = Path(__file__).resolve().parents[2] / "fleet" / "ui" / "static"
PAGE = STATIC / "page.html"
APP = STATIC / "app.js"
OURS = ("page.html", "app.js", "style.css")

# The hooks tests/e2e/test_e2e_ui.py and people's scripts find the page by.
IDS = ("lab", "runs", "runs-filter", "run-state", "nodes", "log", "log-search", "log-rank",
       "stop", "pull", "failure", "hang", "straggler", "attempts", "manifest", "diff-with",
       "diff", "plots", "error")
CLASSES = ("holders", "idle", "state", "line", "tag", "text", "plot")


def _page() -> str:
    return PAGE.read_text()


def _app() -> str:
    return APP.read_text()


def _code(js: str) -> str:
    """app.js without its comments (a comment may name what the code must never do)."""
    return re.sub(r"^\s*//.*$", "", js, flags=re.M)


@pytest.mark.parametrize("sink", ["innerHTML", "outerHTML", "insertAdjacentHTML",
                                  "document.write", "eval(", "new Function", "DOMParser",
                                  "createContextualFragment", "srcdoc"])
def test_no_markup_or_code_from_text(sink: str) -> None:
    assert sink not in _code(_app())


def test_timers_take_functions_not_strings() -> None:
    # setTimeout("code") is eval by another name.
    assert not re.search(r"set(Timeout|Interval)\(\s*[\"'`]", _app())


def test_page_has_no_inline_script_or_handler() -> None:
    page = _page()
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", page, flags=re.S | re.I)
    assert scripts, "the page loads its scripts"
    for attrs, inside in scripts:
        assert "src=" in attrs and not inside.strip(), attrs
    assert not re.search(r"\son[a-z]+\s*=", page, flags=re.I), "an inline event handler"
    assert "javascript:" not in page.lower()
    assert not re.search(r"\.on(click|load|error|input|change)\s*=", _app()), \
        "handlers through addEventListener only"


def test_body_carries_the_servers_marks() -> None:
    assert '<body data-token="__FLEET_TOKEN__" data-page="__FLEET_PAGE__" ' \
           'data-run="__FLEET_RUN__">' in _page()


def test_every_static_url_carries_the_token_and_exists() -> None:
    urls = re.findall(r"""(?:src|href)="(/static/[^"]*)\"""", _page())
    assert {u.split("?")[0].removeprefix("/static/") for u in urls} >= {
        "app.js", "style.css", "uplot.iife.min.js", "uPlot.min.css"}
    for u in urls:
        name, _, query = u.removeprefix("/static/").partition("?")
        assert (STATIC / name).is_file(), u
        assert query == "token=__FLEET_TOKEN__", u


def test_nothing_from_elsewhere() -> None:
    # The page works offline: no URL of another site in our own files.
    for name in OURS:
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", (STATIC / name).read_text(),
                             flags=re.I), name


@pytest.mark.parametrize("hook", IDS)
def test_contract_ids_exist(hook: str) -> None:
    assert f'id="{hook}"' in _page() or f'"{hook}"' in _app(), hook


def test_ids_the_script_uses_are_on_the_page() -> None:
    used = set(re.findall(r"""\$\("([a-z0-9-]+)"\)""", _app()))
    used |= {f"page-{p}" for p in ("lab", "runs", "run")}
    have = set(re.findall(r'id="([^"]+)"', _page()))
    assert used, "app.js finds its elements by id"
    assert used <= have, sorted(used - have)


@pytest.mark.parametrize("cls", CLASSES)
def test_contract_classes_made(cls: str) -> None:
    assert re.search(rf"""class: ["'`]{cls}\b|"{cls}"|"state state-""", _app()), cls


def test_contract_data_attributes_made() -> None:
    app = _app()
    for attr in ("host: h.host, gpu: g.index", "run: r.run_id", "host: n.host", "metric: name"):
        assert attr in app, attr


def test_uplot_vendored_with_its_licence_and_version() -> None:
    lib = (STATIC / "uplot.iife.min.js").read_text()
    assert (STATIC / "uPlot.min.css").stat().st_size > 0
    assert "MIT" in (STATIC / "uplot.LICENSE").read_text()
    version = re.search(r"uPlot \(v([0-9.]+)\)", lib[:200])
    assert version, "the vendored file's banner names its version"
    assert f"uPlot {version.group(1)}" in _app(), "app.js says which uPlot it was written for"


def test_static_files_ship_in_the_package() -> None:
    toml = (STATIC.parents[2] / "pyproject.toml").read_text()
    assert '"fleet.ui" = ["static/*"]' in toml
    assert '"fleet.ui"' in toml.split("package-dir")[0]
