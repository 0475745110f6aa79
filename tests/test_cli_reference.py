"""docs/cli.md is what ``python -m benchmarks.cli_reference`` generates from the parsers, and it has a section for
every command and subcommand the parsers know (walked here independently of the generator)."""

import argparse
import os
import re

from benchmarks import cli_reference
from benchmarks.cli import build_parser

HEADING = re.compile(r"^#{2,3} (mappa(?: [\w-]+)*)$", re.MULTILINE)


def parser_commands(parser: argparse.ArgumentParser, name: str = "mappa", own: dict | None = None) -> list[str]:
    """Every command name under ``parser`` by its ``_SubParsersAction`` choices, less those added without help (an
    old spelling kept working, which ``--help`` does not list); a top-level command in ``own`` (``mappa bench``,
    ``mappa sandbox``: their own parsers) is walked in that parser instead."""
    names = [name]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            listed = {a.dest for a in action._choices_actions}
            for sub_name, sub in action.choices.items():
                if sub_name not in listed:
                    continue
                sub = (own or {}).get(sub_name, sub)
                names += parser_commands(sub, f"{name} {sub_name}")
    return names


def missing_commands(markdown: str, parser: argparse.ArgumentParser, own: dict | None = None) -> list[str]:
    headings = set(HEADING.findall(markdown))
    return [n for n in parser_commands(parser, own=own) if n not in headings]


def test_docs_cli_md_is_generated_from_the_parsers():
    want = cli_reference.render()
    have = cli_reference.PAGE.read_text() if cli_reference.PAGE.exists() else ""
    assert have == want, f"docs/cli.md is out of date: regenerate it with `{cli_reference.COMMAND}`"


def test_every_command_of_the_parsers_has_a_section():
    own = cli_reference.own_parsers()
    names = parser_commands(build_parser(), own=own)
    assert {"mappa report run", "mappa env serve", "mappa bench", "mappa sandbox build"} <= set(names)
    assert not missing_commands(cli_reference.render(), build_parser(), own)


def test_the_coverage_check_finds_a_command_without_a_section():
    parser = build_parser()
    top = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    top.add_parser("extra", help="planted")
    report = next(a for a in top.choices["report"]._actions if isinstance(a, argparse._SubParsersAction))
    report.add_parser("planted", help="planted too")
    own = cli_reference.own_parsers()
    assert missing_commands(cli_reference.render(), parser, own) == ["mappa report planted", "mappa extra"]


def test_check_exits_1_with_a_diff_when_the_page_differs(tmp_path, capsys):
    page = tmp_path / "cli.md"
    page.write_text(cli_reference.render().replace("## mappa train\n", "## mappa training\n"))
    assert cli_reference.check(page) == 1
    out, err = capsys.readouterr()
    assert "-## mappa training" in out and "+## mappa train" in out
    assert cli_reference.COMMAND in err
    page.write_text(cli_reference.render())
    assert cli_reference.check(page) == 0


def test_the_page_does_not_depend_on_the_terminal(monkeypatch):
    wide = cli_reference.render()
    monkeypatch.setenv("COLUMNS", "40")
    assert cli_reference.render() == wide
    assert os.environ["COLUMNS"] == "40"  # put back as it was
