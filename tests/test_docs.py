"""The README is a short front door and the pages under docs/ hold the rest: no page points outside the
repository, names an issue or a commit, or links to a file (or a heading) that does not exist. The
same holds for ARCHITECTURE.md, the map of the code."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "ARCHITECTURE.md"] + sorted((ROOT / "docs").glob("*.md"))
MAX_README_LINES = 320

# Pointers to files that live beside the repository, never in a clone of it.
OUTSIDE = ("../shared", "SPEC.md", "DESIGN.md")
ISSUE = re.compile(r"\bissues? \d+|(?<![\w&])#\d+\b", re.I)
# A commit hash: 7-40 hex digits with at least one letter and one digit (so neither a number nor a word).
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# Links into the package are not checked: its modules are moved between packages often.
UNCHECKED_PREFIXES = ("pipo_jax/",)


def _page_id(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


def _prose(text: str) -> str:
    """`text` without fenced code blocks, code spans and link targets."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.sub(r"\]\([^)\s]*\)", "]", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    heading = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return heading.replace(" ", "-")


def _anchors(path: pathlib.Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


def test_the_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail to docs/ (at most {MAX_README_LINES})"


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_no_page_points_outside_the_repository(page):
    found = [f"{_page_id(page)}:{n}: {word}" for n, line in enumerate(page.read_text().splitlines(), 1)
             for word in OUTSIDE if word in line]
    assert not found, found


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_no_page_names_an_issue_or_a_commit(page):
    prose = _prose(page.read_text())
    issues = ISSUE.findall(prose)
    commits = COMMIT.findall(prose)
    assert not issues, f"{_page_id(page)} names issues {issues}: say what the code does, not where it came from"
    assert not commits, f"{_page_id(page)} names commits {commits}: provenance lives in experiments/results/*.json"


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_relative_link_reaches_an_existing_file_and_heading(page):
    broken = []
    for target in LINK.findall(_prose_keeping_links(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        try:
            rel = dest.relative_to(ROOT)
        except ValueError:
            broken.append(f"{target} (outside the repository)")
            continue
        if str(rel).startswith(UNCHECKED_PREFIXES):
            continue
        if not dest.exists():
            broken.append(f"{target} (no file {rel})")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {rel})")
    assert not broken, f"{_page_id(page)}: {broken}"


def _prose_keeping_links(text: str) -> str:
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def test_every_docs_page_is_listed_in_the_readme():
    readme = README.read_text()
    missing = [p.name for p in PAGES if p.parent.name == "docs" and f"(docs/{p.name})" not in readme]
    assert not missing, f"README.md's 'Where to go next' does not link {missing}"


def test_the_checks_catch_what_they_are_for():
    assert ISSUE.search(_prose("fixed in issue 29.5 and #28"))
    assert not ISSUE.search(_prose("see [math](math.md#2-pipo) and `#12` in code"))
    assert COMMIT.findall(_prose("measured at 9a81394 (code `70ff163`)")) == ["9a81394"]
    assert not COMMIT.findall(_prose("1234567 rows, a deadbeef value, 2026-11-26"))
    assert _slug("## 2. PIPO (the closed loop)".lstrip("# ")) == "2-pipo-the-closed-loop"
    assert _slug("Sampler (`pipo_jax/sampling/`)") == "sampler-pipo_jaxsampling"
