"""Reference pages written from the code at build time, so that none can drift from it.

* ``configuration/settings.md`` from ``kvstore.config.SETTINGS`` (every flag and TOML key, its default, its help);
* ``reference/cli.md`` from the argparse tree of ``kvstore.cli.main.build_parser`` (every command and flag);
* ``reference/metrics.md`` from ``kvstore.metrics.definitions.METRICS`` (every series ``/metrics`` serves);
* ``reference/wire.md`` from ``kvstore.protocol.wire.Op`` and the error classes' wire codes.

The generators are plain functions that need only kvstore (``generate()`` returns ``{page path: Markdown}``), so
a test can run them without MkDocs. The ``on_*`` functions below are the MkDocs hooks (``hooks:`` in
``mkdocs.yml``): they add the generated pages to the build, and place a page that ``nav`` does not list yet at the
end of the section of its folder, so a new page under ``docs/operations/`` appears in Operations without an edit
of ``mkdocs.yml``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)   # the checkout's kvstore, as the tests import it

# Folder under docs/ -> the nav section whose unlisted pages it holds.
SECTIONS = {
    "guide": "Getting started",
    "configuration": "Configuration",
    "operations": "Operations",
    "connectors": "Connectors",
    "deployment": "Deployment",
    "design": "Design",
    "benchmarks": "Benchmarks",
    "development": "Development",
    "reference": "Reference",
}

GENERATED_NOTE = ("<!-- Generated at build time by docs/hooks/reference.py from {source}; "
                  "edit the source, not this page. -->\n\n")


def cell(text: str) -> str:
    """Text fit for one Markdown table cell: one line, pipes escaped, reST literals as Markdown ones."""
    return " ".join(str(text).replace("``", "`").replace("|", "\\|").split())


# -- configuration -------------------------------------------------------------------------------------------

def flag_name(setting_name: str) -> str:
    return "--" + setting_name.replace("_", "-")


def shown_default(setting: Any) -> str:
    """The default as a reader should see it: a constant shown as it is written in a flag, a default computed on
    the machine (a named function such as ``default_host_mem``) by the first line of that function's docstring."""
    compute: Callable[[], Any] = setting.default
    if getattr(compute, "__name__", "<lambda>") != "<lambda>":
        doc = (compute.__doc__ or "").strip().splitlines()
        return cell(doc[0]) if doc else f"computed at start (`{compute.__name__}`)"
    value = compute()
    if value is None or value == "":
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)) and value < 0:
        return "`auto`"
    if setting.metavar == "SECONDS":
        return f"`{value:g}s`"
    return f"`{value}`"


def configuration_page() -> str:
    from kvstore.config import SETTINGS

    lines = [GENERATED_NOTE.format(source="kvstore/config.py (SETTINGS)"),
             "# Settings reference\n",
             ("Every setting of `kvstore serve`, as a flag and as a key of the TOML file given with `--config FILE`. "
              "Precedence: flag > config file > default. A key may be written with `_` or `-`; an unknown key, a "
              "bad value or a setting that cannot work on this machine stops the daemon with one line naming it "
              "and exit code 2. The `ready` log line shows every setting as in force, derived values included. "
              "How to choose them: [Configuration](index.md).\n"),
             "| flag | TOML key | default | meaning |",
             "| --- | --- | --- | --- |"]
    for s in SETTINGS:
        if s.switch:
            flag = f"{flag_name(s.name)} / --no-{s.name.replace('_', '-')}"
        else:
            flag = f"{flag_name(s.name)} {s.metavar}"
        lines.append(f"| `{flag}` | `{s.name}` | {shown_default(s)} | {cell(s.help)} |")
    lines.append("")
    return "\n".join(lines)


# -- command line ----------------------------------------------------------------------------------------------

def subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of every subcommand of ``parser``, in the order they were registered."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def expanded_help(action: argparse.Action, prog: str) -> str:
    """The help text as ``--help`` prints it (``%(default)s`` filled in, ``%%`` as ``%``)."""
    text = action.help or ""
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    params["prog"] = prog
    if isinstance(params.get("choices"), (list, tuple, dict)):
        params["choices"] = ", ".join(map(str, params["choices"]))
    try:
        return text % params
    except (KeyError, TypeError, ValueError):
        return text


def option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, (argparse._SubParsersAction,
                                                                   argparse._HelpAction)):
            continue
        if action.option_strings:
            name = "`, `".join(action.option_strings)
            if action.nargs != 0:
                name += f" {action.metavar or action.dest.upper()}"
        else:
            name = str(action.metavar or action.dest)
        rows.append(f"| `{name}` | {cell(expanded_help(action, parser.prog))} |")
    return rows


def command_section(parser: argparse.ArgumentParser, title: str, summary: str, depth: int) -> list[str]:
    usage = parser.format_usage().replace("usage: ", "", 1).strip()
    lines = [f"{'#' * depth} `{title}`", ""]
    if summary or parser.description:
        lines += [cell(parser.description or summary), ""]
    lines += ["```text", usage, "```", ""]
    rows = option_rows(parser)
    if rows:
        lines += ["| argument | meaning |", "| --- | --- |", *rows, ""]
    for name, helptext, sub in subcommands(parser):
        lines += command_section(sub, f"{title} {name}", helptext, min(depth + 1, 4))
    return lines


def cli_page() -> str:
    from kvstore.cli.main import build_parser

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"   # usage lines wrapped the same on every machine, not at the terminal's width
    try:
        return cli_markdown(build_parser())
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


def cli_markdown(parser: argparse.ArgumentParser) -> str:
    lines = [GENERATED_NOTE.format(source="the argparse tree of kvstore/cli/main.py"),
             "# Command line\n",
             ("Every command and flag, as `kvstore COMMAND --help` prints them. A bad flag or value gives one "
              "line naming it and exit code 2.\n"),
             "| command | what it does |", "| --- | --- |"]
    lines += [f"| [`kvstore {name}`](#kvstore-{name}) | {cell(helptext)} |"
              for name, helptext, _ in subcommands(parser)]
    lines += ["", "Options of `kvstore` itself:", "", "| argument | meaning |", "| --- | --- |",
              *option_rows(parser), ""]
    for name, helptext, sub in subcommands(parser):
        lines += command_section(sub, f"kvstore {name}", helptext, 2)
    return "\n".join(lines)


# -- metrics ---------------------------------------------------------------------------------------------------

def metrics_page() -> str:
    from kvstore.metrics.alerts import alert_rules
    from kvstore.metrics.definitions import METRICS

    lines = [GENERATED_NOTE.format(source="kvstore/metrics/definitions.py (METRICS)"),
             "# Metrics reference\n",
             ("Every series `/metrics` serves (`--metrics-port`), with the `kvstore_` prefix. Counters are exposed "
              "with `_total`; a histogram as `_bucket`, `_count` and `_sum`. The alert rules (`kvstore alerts`) and "
              "the Grafana dashboard (`kvstore dashboard`) are generated from the same definitions. How to use "
              "them: [Metrics](../operations/metrics.md).\n"),
             "| series | type | labels | meaning |", "| --- | --- | --- | --- |"]
    for m in METRICS:
        labels = ", ".join(f"`{label}`" for label in m.labels)
        lines.append(f"| `{m.sample_name}` | {m.kind} | {labels} | {cell(m.help)} |")
    lines += ["", "## Alert rules", "",
              "What `kvstore alerts` writes (kvstore/metrics/alerts.py), built from the definitions above:", "",
              "| alert | severity | for | fires when | expression |", "| --- | --- | --- | --- | --- |"]
    for rule in alert_rules():
        lines.append(f"| `{rule.alert}` | {rule.severity} | {rule.duration} | {cell(rule.summary)} | "
                     f"`{cell(rule.expr)}` |")
    lines.append("")
    return "\n".join(lines)


# -- wire protocol ---------------------------------------------------------------------------------------------

def op_comments() -> dict[str, str]:
    """``{op name: its comment in kvstore/protocol/wire.py}`` (the source is the only place that says it)."""
    import inspect

    from kvstore.protocol.wire import Op

    found = re.findall(r"^\s+([A-Z_]+) = \d+[ \t]*(?:#[ \t]*(.*))?$", inspect.getsource(Op), flags=re.MULTILINE)
    return {name: comment for name, comment in found}


def wire_page() -> str:
    from kvstore import errors
    from kvstore.protocol import wire

    comments = op_comments()
    lines = [GENERATED_NOTE.format(source="kvstore/protocol/wire.py and kvstore/errors.py"),
             "# Wire protocol reference\n",
             (f"Protocol version {wire.PROTOCOL_VERSION}. A request is a msgpack header (at most "
              f"{wire.MAX_HEADER_BYTES // 1024} KiB) with an `op` and a request id, and at most "
              f"{wire.MAX_BATCH} keys a request. Operation codes are append-only; how the daemon serves them: "
              "[Wire protocol](../design/wire-protocol.md).\n"),
             "| op | code | what it does |", "| --- | --- | --- |"]
    for op in wire.Op:
        lines.append(f"| `{op.name}` | {op.value} | {cell(comments.get(op.name, ''))} |")
    lines += ["", "## Error codes", "",
              ("An error reply carries one of these codes and one line of text; the client raises the class, "
               "every one a `kvstore.KVStoreError`. An unknown code is raised as `InternalError`."), "",
              "| code | raised as |", "| --- | --- |"]
    codes = sorted((cls.code, cls.__name__) for cls in errors.RequestError.__subclasses__())
    lines += [f"| {code} | `{name}` |" for code, name in codes]
    lines.append("")
    return "\n".join(lines)


PAGES: dict[str, Callable[[], str]] = {
    "configuration/settings.md": configuration_page,
    "reference/cli.md": cli_page,
    "reference/metrics.md": metrics_page,
    "reference/wire.md": wire_page,
}


def generate() -> dict[str, str]:
    """Every generated page: ``{path under docs/: Markdown}``."""
    return {path: build() for path, build in PAGES.items()}


# -- MkDocs hooks ----------------------------------------------------------------------------------------------

def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for path, text in generate().items():
        files.append(File.generated(config, path, content=text))
    return files


def on_nav(nav: Any, config: Any, files: Any) -> Any:
    from mkdocs.structure.nav import Page, Section

    listed = {page.file.src_uri for page in nav.pages}
    sections = {item.title: item for item in nav.items if isinstance(item, Section)}
    for file in files.documentation_pages():
        folder = file.src_uri.split("/", 1)[0]
        section = sections.get(SECTIONS.get(folder, ""))
        if file.src_uri in listed or section is None:
            continue
        page = Page(None, file, config)
        page.parent = section
        if nav.pages:
            page.previous_page, nav.pages[-1].next_page = nav.pages[-1], page
        section.children.append(page)
        nav.pages.append(page)
    return nav
