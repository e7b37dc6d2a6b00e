"""The documentation works from a plain clone: every relative link in README.md,
CHANGELOG.md and docs/**/*.md names a file in the repository (and a heading there, when
it names one), and no path in the text reaches outside the repository (the team's notes
beside it are not in a clone)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.support.docs import CODE_SPAN, anchors, links, prose

ROOT = Path(__file__).parents[2]
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]

def broken_links(doc: Path, root: Path = ROOT) -> list[str]:
    text = doc.read_text()
    broken = []
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
            continue
        path_part, _, fragment = target.partition("#")
        resolved = (doc.parent / unquote(path_part)).resolve() if path_part else doc
        if not resolved.is_relative_to(root) or not resolved.exists():
            broken.append(f"{target}: no such file in the repository")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(
                resolved.read_text()):
            broken.append(f"{target}: no heading #{fragment} in {resolved.relative_to(root)}")
    return broken


def paths_outside(doc: Path, root: Path = ROOT) -> list[str]:
    """Code spans naming a path that starts with '../' and is not a file or folder in the
    repository (the team's notes beside the repository are not in a clone)."""
    outside = []
    for span in (m.group(2).strip() for m in CODE_SPAN.finditer(prose(doc.read_text()))):
        if span.startswith("../") and " " not in span:
            resolved = (doc.parent / span).resolve()
            if not resolved.is_relative_to(root) or not resolved.exists():
                outside.append(span)
    return outside


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_in_the_repository(doc: Path) -> None:
    assert broken_links(doc) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_path_names_a_file_outside_the_repository(doc: Path) -> None:
    assert paths_outside(doc) == []


def test_the_checks_catch_what_they_look_for(tmp_path: Path) -> None:
    """The helpers on a small repository with one of each kind of link, good and bad."""
    root = tmp_path / "repo"
    (root / "docs" / "bench").mkdir(parents=True)
    (root / "README.md").write_text("# Readme\n")
    (root / "gateway").mkdir()
    (root / "gateway" / "app.py").write_text("")
    (root / "docs" / "bench" / "latency.png").write_bytes(b"")
    (root / "docs" / "benchmarks.md").write_text("# Benchmarks\n## Current figures\n")
    (tmp_path / "outside.md").write_text("# Outside the repository\n")
    good = root / "docs" / "good.md"
    good.write_text(
        "[a](benchmarks.md) [b](benchmarks.md#current-figures) ![c](bench/latency.png)\n"
        "[d](https://example.com/x.md) [e](#links-here) `[g](inside-a-code-span.md)`\n"
        "[f]: ../README.md\n\n## Links here\n\n```sh\n[h](in-a-fence.md)\n```\n"
        "See `../gateway/app.py` and `../docs/bench/`.\n")
    bad = root / "docs" / "bad.md"
    bad.write_text(
        "[a](nowhere.md) [b](benchmarks.md#no-such-heading) [c](../../outside.md)\n"
        "[e](#not-here)\n\n[d]: missing/file.txt\n\n"
        "See `../../shared/docs/notes.md` and `../shared/docs/plan.md`.\n")
    assert broken_links(good, root) == []
    assert paths_outside(good, root) == []
    assert [b.split(":")[0] for b in broken_links(bad, root)] == [
        "nowhere.md", "benchmarks.md#no-such-heading", "../../outside.md", "#not-here",
        "missing/file.txt"]
    assert paths_outside(bad, root) == ["../../shared/docs/notes.md", "../shared/docs/plan.md"]


def test_anchors_follow_githubs_rules() -> None:
    text = ("# Benchmarks\n## Across cores: `serve --workers N` (scenario `workers`)\n"
            "### This machine's yardstick\n## Soak\n## Soak\n")
    assert anchors(text) == {"benchmarks", "across-cores-serve---workers-n-scenario-workers",
                             "this-machines-yardstick", "soak", "soak-1"}


def test_the_links_in_the_docs_are_found() -> None:
    """The checks above see the docs' real links (a pattern matching nothing passes all)."""
    readme = set(links((ROOT / "README.md").read_text()))
    assert {"docs/runtime-controls.md", "docs/resume.md#a-fleet-of-gateways",
            "#troubleshooting"} <= readme
    quic = set(links((ROOT / "docs" / "quic.md").read_text()))
    assert {"benchmarks.md#quic-beside-tcp",
            "configuration.md#tls-session-auth-and-secrets"} <= quic
    configuration = set(links((ROOT / "docs" / "configuration.md").read_text()))
    assert {"../deploy/gateway.example.toml", "protocol.md#conformance"} <= configuration
    benchmarks = set(links((ROOT / "docs" / "benchmarks.md").read_text()))
    assert {"bench/results.json", "bench/latency.png"} <= benchmarks


PLOTS = (".png", ".svg", ".jpg", ".jpeg", ".gif")


def shown_files(docs: list[Path]) -> set[Path]:
    """Every file a doc's links name, resolved."""
    return {(doc.parent / unquote(target.partition("#")[0])).resolve()
            for doc in docs for target in links(doc.read_text())
            if target.partition("#")[0] and not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I)}


def test_every_plot_under_docs_is_shown_by_a_doc() -> None:
    """A plot no page shows is one nobody reads or keeps up to date (issue 37: one under
    docs/bench/issue16/passes had labels printed over each other)."""
    shown = shown_files(DOCS)
    orphans = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "docs").rglob("*")
                     if path.suffix.lower() in PLOTS and path.resolve() not in shown)
    assert orphans == []
