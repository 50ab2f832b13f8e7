"""Every Markdown page of the repository as a user follows it: every relative link resolves (to a
file, and to a heading where it names one), every section named by title exists, every Python file
named is there, and every `tritonkit` command shown parses, each flag known to its subcommand."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT
from tritonkit.cli import build_parser
from tritonkit.spec import DeploySpec

# Folders that hold no page of the kit's, besides hidden ones (.venv, .git, tools' caches): generated
# output. Every other *.md in the checkout is a page.
NOT_PAGES = {"node_modules", "out", "build", "wheelhouse", "models"}


def find_pages(root: Path) -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        # not into hidden folders, generated output, or the generated model folders of model_repository/
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in NOT_PAGES
                         and here.name != "model_repository")
        found += [here / f for f in files if f.endswith(".md")]
    return sorted(found)


PAGES = find_pages(REPO_ROOT)
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


# A section named in prose: (README, "Overload on Triton 2.51") or docs/tuning.md, "Decisions on ..."
SECTION = re.compile(r"\b((?:[\w.-]+/)*(?:README|[\w.-]+\.md)),\s+\"([^\"]+)\"")


def headings(page: Path) -> set[str]:
    return {line.lstrip("#").strip().replace("`", "").lower()
            for line in page.read_text().splitlines() if line.startswith("#")}


def missing_sections(page: Path) -> list[str]:
    """Sections a page names by title in another page (or its own) that the page has no heading for."""
    bad = []
    for name, title in SECTION.findall(page.read_text()):
        name = "README.md" if name == "README" else name
        dest = next((d for d in (page.parent / name, REPO_ROOT / name) if d.is_file()), None)
        if dest is None or title.replace("`", "").lower() not in headings(dest):
            bad.append(f"{page.name}: {name}, \"{title}\"")
    return bad


def missing_sources(page: Path) -> list[str]:
    """Python files the page names that are not there: a path with a folder (from the repository's
    root or the page's folder), and in a folder's own README a bare file name (from that folder)."""
    own_readme = page.name == "README.md" and page.parent not in (REPO_ROOT, REPO_ROOT / "docs")
    bad = []
    for code in CODE.findall(page.read_text()):
        if not re.fullmatch(r"[\w.-]+(/[\w.-]+)*\.py", code) or ("/" not in code and not own_readme):
            continue
        if not ((REPO_ROOT / code).exists() or (page.parent / code).exists()):
            bad.append(f"{page.name}: {code}")
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


def page_id(page: Path) -> str:
    return str(page.relative_to(REPO_ROOT))


def test_every_page_is_checked():
    """The pages a user reads first are among those checked, and no page is found twice."""
    names = {page_id(p) for p in PAGES}
    for page in ("README.md", "ARCHITECTURE.md", "docs/README.md", "docs/outputs.md", "docs/troubleshooting.md",
                 "docs/glossary.md", "loadtests/README.md", "build_engines/README.md", "helm/triton-edge/README.md"):
        assert page in names, page
    assert len(names) == len(PAGES)
    assert not any(n.startswith((".venv", ".git")) for n in names)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_resolves(page):
    assert not broken_links(page)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_source_file_named_exists(page):
    assert not missing_sources(page)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_section_named_exists(page):
    assert not missing_sections(page)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
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
    readme = tmp_path / "pkg" / "README.md"
    readme.parent.mkdir()
    (readme.parent / "here.py").write_text("")
    readme.write_text("`here.py`, `gone.py`, `tuner/sweep.py`, `tuner/gone.py`\n")
    assert missing_sources(readme) == ["README.md: gone.py", "README.md: tuner/gone.py"]
    page.write_text('(there.md, "A heading") and (README, "No such section")\n')
    assert missing_sections(page) == ['page.md: README.md, "No such section"']


def test_the_reference_example_is_a_spec_and_batches_as_deploy_yaml():
    """The deploy.yaml reference's example has only keys the spec knows, and its batching and
    instances are the repository's deploy.yaml's, the config that does not stall Triton 2.51."""
    text = (REPO_ROOT / "docs" / "deploy-yaml.md").read_text()
    example = DeploySpec.model_validate(yaml.safe_load(re.search(r"```yaml\n(models:.*?)```", text, re.S)[1]))
    shipped = DeploySpec.model_validate(yaml.safe_load((REPO_ROOT / "deploy.yaml").read_text()))
    assert example.models[0].batching == shipped.models[0].batching
    assert example.models[0].instances == shipped.models[0].instances


def test_the_readme_is_a_guide_not_a_log():
    readme = (REPO_ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    assert not re.search(r"\b[0-9a-f]{7}\b.*commit|commit `[0-9a-f]{7}`|\b\d{1,2}:\d{2}\b", readme)
    for page in PAGES:
        assert not re.search(r"commit `?[0-9a-f]{7}", page.read_text()), page_id(page)


def test_the_support_page_is_the_support_table():
    """docs/support.md lists exactly the releases tritonkit/support.py supports, with the same
    Triton and TensorRT versions and the Jetson image of each."""
    from tritonkit.support import LAST_IGPU, RELEASES

    page = (REPO_ROOT / "docs" / "support.md").read_text()
    rows = re.findall(r"^\| (\d\d\.\d\d) \| ([\d.]+) \| ([^|]+) \|[^\n]*\| ([^|]+) \|$", page, re.M)
    assert [(r.release, r.triton, r.tensorrt or "from the build image",
             "`-py3-igpu` (arm64)" if r.release <= LAST_IGPU else "`-py3` (SBSA, arm64)") for r in RELEASES] == \
        [(a, b, c.strip(), d.strip()) for a, b, c, d in rows]
