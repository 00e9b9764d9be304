"""The README is a short front door and the pages under docs/ hold the rest: no page points outside the
repository, names an issue, carries a date or a commit stamp, or links to a file (or a heading) that does not
exist. The same holds for ARCHITECTURE.md, the map of the code, which wraps at 120 columns and whose import
table is the code's."""

import pathlib
import re

import pytest

from tests import import_graph, wrap_markdown

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "ARCHITECTURE.md"] + sorted((ROOT / "docs").glob("*.md"))
MAX_README_LINES = 320

# Pointers to files that live beside the repository, never in a clone of it.
OUTSIDE = ("../shared", "SPEC.md", "DESIGN.md")
ISSUE = re.compile(r"\bissues? \d+|(?<![\w&])#\d+\b", re.I)
# A commit hash: 7-40 hex digits with at least one letter and one digit (so neither a number nor a word).
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")
# What dates a page as a lab notebook: a day's date (2026-11-28, Nov 28, 28 November, November 28, 2026). A month
# and year alone ("their blog of March 2025") dates a publication the page cites, and stays.
_MONTH = (r"(?:January|February|March|April|May|June|July|August|September|October|November|December"
          r"|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)\.?")
DATE = re.compile(rf"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b|\b{_MONTH} [0-3]?\d(?:st|nd|rd|th)?\b"
                  rf"|\b[0-3]?\d(?:st|nd|rd|th)? {_MONTH}(?!\w)")
# A commit stamp anywhere in a page, code spans and blocks too: 7-40 hex digits (a letter and a digit among them)
# or '+dirty'. Another repository's pinned version, `owner/repo@hash`, is a reference and stays.
STAMP = re.compile(r"(?<![\w@])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b(?!@)|\+dirty\b")
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
def test_no_page_carries_a_date_or_a_commit_stamp(page):
    """A page says what is true now; when and at which commit a result was measured is in the JSON its rendered
    table cites (experiments/results/), and the history in the git log."""
    found = [f"{_page_id(page)}:{n}: {m.group(0)!r}" for n, line in enumerate(page.read_text().splitlines(), 1)
             for m in (*DATE.finditer(line), *STAMP.finditer(line))]
    assert not found, "dates or commit stamps (cite the results JSON instead):\n" + "\n".join(found)


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
    missing = [p.name for p in PAGES if p.parent == ROOT / "docs" and f"(docs/{p.name})" not in readme]
    assert not missing, f"README.md's 'Where to go next' does not link {missing}"


def test_the_checks_catch_what_they_are_for():
    assert ISSUE.search(_prose("fixed in issue 29.5 and #28"))
    assert not ISSUE.search(_prose("see [math](math.md#2-pipo) and `#12` in code"))
    assert COMMIT.findall(_prose("measured at 9a81394 (code `70ff163`)")) == ["9a81394"]
    assert not COMMIT.findall(_prose("1234567 rows, a deadbeef value, 2026-11-26"))
    dated = ("measured 2026-11-28 on", "(Nov 28)", "on 3 December", "December 3rd, 2026", "Sept. 5")
    assert all(DATE.search(x) for x in dated)
    assert not any(DATE.search(x) for x in ("their blog of March 2025", "8 decode steps", "seed 0-4", "10-20 s"))
    stamped = ("commit `b2158582ea3e+dirty`", "at 9a81394", "records +dirty for", "`deadbeef01`")
    assert all(STAMP.search(x) for x in stamped)
    assert not any(STAMP.search(x) for x in ("`JacckMa/pipo_verl@7f48e23`", "1234567 rows", "a deadbeef value",
                                              "0x7fffffff", "sha256 of abcdefg"))
    assert _slug("## 2. PIPO (the closed loop)".lstrip("# ")) == "2-pipo-the-closed-loop"
    assert _slug("Sampler (`pipo_jax/sampling/`)") == "sampler-pipo_jaxsampling"


def test_the_architecture_import_table_is_the_codes():
    committed = import_graph.committed_table((ROOT / "ARCHITECTURE.md").read_text())
    assert committed == import_graph.import_table(), \
        f"ARCHITECTURE.md's import table differs from the code's imports; run `{import_graph.REGENERATE}`"


def test_the_import_table_lists_packages_lowest_first_and_refuses_a_cycle():
    assert import_graph._depths({"a": set(), "b": {"a"}, "c": {"a", "b"}}) == {"a": 0, "b": 1, "c": 2}
    with pytest.raises(ValueError, match="a -> b -> a"):
        import_graph._depths({"a": {"b"}, "b": {"a"}})
    table = import_graph.import_table().splitlines()
    rows = [line.split(" -> ")[0].strip() for line in table if " -> " in line]
    assert rows.index("models") < rows.index("sampling") < rows.index("rl") < rows.index("run") < rows.index(
        "experiments") and set(rows) >= {"losses", "tasks", "configs", "data", "parallel", "platforms"}
    assert max(map(len, table)) <= wrap_markdown.WIDTH


def test_architecture_wraps_at_120_columns():
    long = wrap_markdown.long_lines((ROOT / "ARCHITECTURE.md").read_text())
    assert not long, (f"ARCHITECTURE.md lines {long} pass 120 columns; "
                      "run `python -m tests.wrap_markdown ARCHITECTURE.md`")


def test_the_wrapper_keeps_every_word_and_code_span_and_leaves_the_rest():
    text = ("# A heading that is long " + "x " * 70 + "\n\n- item " + "word " * 30 + "`a code span with spaces` "
            + "tail " * 10 + "\n  continued\n\n| a | " + "cell " * 40 + "|\n\n```\n" + "code " * 40
            + "\n```\nshort line\n")
    wrapped = wrap_markdown.wrap(text, width=60)
    assert wrapped.split() == text.split() and wrap_markdown.wrap(wrapped, width=60) == wrapped
    assert wrap_markdown.long_lines(wrapped, width=60) == [] and wrap_markdown.long_lines(text, width=60) == [3]
    assert any(line.endswith("`a code span with spaces`") or "`a code span with spaces`" in line
               for line in wrapped.splitlines())
    items = wrapped.split("\n\n")[1].splitlines()
    assert items[0].startswith("- item ") and all(line.startswith("  ") for line in items[1:])
    for kept in ("# A heading", "| a | cell", "code " * 40, "short line"):
        assert any(line.startswith(kept) for line in wrapped.splitlines()), kept
