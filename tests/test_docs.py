"""The README and docs/ as a user follows them: every relative link resolves (to a file, and to a
heading where it names one), and every `tritonkit` command they show parses, each flag known to
its subcommand."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tritonkit.cli import build_parser

PAGES = [REPO_ROOT / "README.md", REPO_ROOT / "ARCHITECTURE.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return out


def broken_links(page: Path) -> list[str]:
    bad = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{page.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{page.name}: {target} (no such heading)")
    return bad


def commands(page: Path) -> list[str]:
    """`tritonkit ...` as a user would type it: inline code and lines of code blocks."""
    text = page.read_text()
    found = [c for c in CODE.findall(text) if c.startswith("tritonkit ")]
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():  # a command continued over lines is one
            line = line.split("#")[0].strip().removeprefix("$ ")
            for prefix in (".venv/bin/", "/opt/tritonkit/bin/"):
                line = line.removeprefix(prefix)
            if line.startswith("tritonkit "):
                found.append(line.rstrip("&").strip())
    return found


def unknown_flags(command: str) -> list[str]:
    """The subcommand and flags of one shown command that the real parser does not know."""
    words = shlex.split(command.replace("|", " "))[1:]
    sub = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001 - the parser's own table
    if not words or words[0] not in sub:
        return [f"subcommand {words[:1]}"]
    parser = sub[words[0]]
    known = {s for a in parser._actions for s in a.option_strings}  # noqa: SLF001
    return [w for w in words[1:] if w.startswith("--") and w.split("=")[0] not in known]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    assert not broken_links(page)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_shown_parses(page):
    bad = {c: unknown_flags(c) for c in commands(page)}
    assert not {c: u for c, u in bad.items() if u}


def test_every_subcommand_answers_help(capsys):
    sub = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001
    for name in sub:
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args([name, "--help"])
        assert e.value.code == 0, name
    assert "tritonkit bench" in capsys.readouterr().out


def test_the_checks_catch_a_broken_link_and_an_unknown_flag(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A heading\n")
    page.write_text("[ok](there.md#a-heading) [gone](missing.md) [nohead](there.md#nope)\n"
                    "`tritonkit loadtest --model m --rate 5` and `tritonkit loadtest --no-such-flag`\n")
    assert broken_links(page) == ["page.md: missing.md (no such file)", "page.md: there.md#nope (no such heading)"]
    assert [unknown_flags(c) for c in commands(page)] == [[], ["--no-such-flag"]]


def test_the_readme_is_a_guide_not_a_log():
    readme = (REPO_ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    assert not re.search(r"\b[0-9a-f]{7}\b.*commit|commit `[0-9a-f]{7}`|\b\d{1,2}:\d{2}\b", readme)
    for page in PAGES[2:]:
        assert not re.search(r"commit `?[0-9a-f]{7}", page.read_text()), page.name
