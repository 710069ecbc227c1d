"""The README and the reference under docs/ are executed, so they cannot drift from the code: their
examples run with the values they show, their commands parse, their links lead somewhere, and the
config page's key table says what the parameter table says."""

from __future__ import annotations

import ast
import doctest
import re
import shlex
import warnings
from pathlib import Path

import pytest

from zbopt.core.errors import ZboptError
from zbopt.core.problem.batch import BATCH_FLAGS, PACKING_KEYS
from zbopt.core.problem.parameters import PARAMETERS
from zbopt.interfaces.cli.inputs import OPTION_KEYS
from zbopt.interfaces.cli.parser import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PAGE_IDS = [str(page.relative_to(ROOT)) for page in PAGES]
CODE_SPAN = re.compile(r"`(zbopt [^`]+)`")
PLACEHOLDER = re.compile(r"[\[<]|\.\.\.|…|\b(?!T?FLOPS\b)[A-Z][A-Z_]{2,}\b")  # [--flag], <command>, FILE
LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)")


def _blocks(text: str, languages: tuple[str, ...]) -> list[str]:
    return re.findall(r"(?ms)^```(?:" + "|".join(languages) + r")\n(.*?)^```", text)


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as dashes."""
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"(?m)^#{1,6} (.+)$", text)}


EXAMPLE_PAGES = [page for page in PAGES if _blocks(page.read_text(), ("pycon",))]


def test_the_guide_and_the_python_page_have_examples():
    assert {"README.md", "python.md"} <= {page.name for page in EXAMPLE_PAGES}


@pytest.mark.parametrize("page", EXAMPLE_PAGES, ids=[page.name for page in EXAMPLE_PAGES])
def test_the_examples_give_the_values_they_show(page, tmp_path, monkeypatch):
    """A page's `pycon` blocks, one session, run in a scratch folder holding `examples/`: each
    `>>>` line prints what the page shows (doctest's rules)."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    session = "\n".join(_blocks(page.read_text(), ("pycon",)))
    test = doctest.DocTestParser().get_doctest(session, {}, page.name, str(page), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    failed, tried = runner.summarize(verbose=False)
    assert tried and not failed, f"{failed} of {tried} examples in {page.name} differ (doctest's report above)"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_the_python_blocks_compile_and_their_imports_resolve(page):
    """A `python` block that is not run (a cluster, a process pool) still names modules and
    functions that exist: it compiles, and its import lines run."""
    for block in _blocks(page.read_text(), ("python",)):
        tree = ast.parse(block)
        imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)  # a page names the new paths, not the moved ones
            exec(compile(ast.Module(body=imports, type_ignores=[]), page.name, "exec"), {})


def _commands(text: str) -> list[str]:
    """The concrete `zbopt ...` commands of a page: in shell blocks (a line each, comments cut) and
    in code spans; a synopsis (brackets, "...", upper-case placeholders) is not a command."""
    found = []
    for block in _blocks(text, ("sh", "bash", "console")):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip().removeprefix("$ ")
            line = re.split(r"\s[>|]\s", line)[0]  # the command, its output redirected or piped aside
            if line.startswith("zbopt "):
                found.append(line)
    found += CODE_SPAN.findall(text)
    return [command for command in found
            if not PLACEHOLDER.search(command)]


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_command_shown_parses(page):
    """A renamed flag or command breaks the page, not only the user who copies from it."""
    commands = _commands(page.read_text())
    for command in commands:
        argv = shlex.split(command)[1:]
        try:
            build_parser().parse_args(argv)
        except SystemExit as error:  # --help and --version print and exit 0
            assert error.code == 0, command
        except ZboptError as error:  # a usage mistake: the message names the flag
            pytest.fail(f"{page.name}: `{command}`: {error}")
    if page.name in ("README.md", "cli.md"):
        assert len(commands) >= 3, "the guide and the CLI page show commands: the reader above found none"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_link_leads_to_a_file_and_heading_that_exist(page):
    text = page.read_text()
    for target, anchor in LINK.findall(text):
        if target.startswith(("http://", "https://")):
            continue
        path = (page.parent / target) if target else page
        assert path.exists(), f"{page.name}: link to {target}"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path.read_text()), f"{page.name}: no heading '{anchor}' in {path.name}"


def _key_table() -> dict[str, str]:
    """docs/config.md's key table: each key (aliases in brackets too) -> its flag column."""
    text = (ROOT / "docs" / "config.md").read_text().split("## Config reference", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for keys, flags in re.findall(r"(?m)^\| (`[^|]+) \| ([^|]+) \|", text):
        for key in re.findall(r"`(\w+)`", keys):
            rows[key] = flags.strip()
    return rows


def test_the_config_page_lists_every_key_with_its_flags():
    """Every parameter's documented config key is a row of the table whose flags are flags the
    command line takes for it ("(config only)" where it takes none), and no row names a key that
    zbopt refuses."""
    rows = _key_table()
    simulate = build_parser()._subparsers._group_actions[0].choices["simulate"]
    simulate.parse_known_args([])  # adds the flags it holds back until parsed
    takes: dict[str, set[str]] = {}
    for action in simulate._actions:
        takes.setdefault(action.dest, set()).update(action.option_strings)
    known = {*BATCH_FLAGS, *PACKING_KEYS, *OPTION_KEYS}
    for entry in (entry for entry in PARAMETERS if entry.shape != "stored"):  # stored: no config key
        known.update(entry.config_keys)
        documented = entry.config_keys[0]
        assert documented in rows, f"{documented} has no row in docs/config.md"
        shown = set(re.findall(r"`(-[-\w]+)`", rows[documented]))
        accepted = takes.get(documented, set())
        if not accepted:
            assert rows[documented] == "(config only)", f"{documented}: the command line has no flag for it"
        else:
            assert shown and shown <= accepted, f"{documented}: the page shows {rows[documented]}, the CLI takes " \
                                                f"{sorted(accepted)}"
    assert set(rows) <= known, f"keys zbopt does not read: {sorted(set(rows) - known)}"
