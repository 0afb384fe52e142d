"""The documentation cannot drift from the code: the settings, CLI and metrics references are generated from it
(docs/hooks/reference.py), every name the code defines is on those pages, the README's first screen starts and
sizes the daemon, and the site builds with ``mkdocs build --strict`` (where MkDocs is installed)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import types
from dataclasses import replace

import pytest
from support.paths import ROOT

README = os.path.join(ROOT, "README.md")


def load_reference() -> types.ModuleType:
    """docs/hooks/reference.py, imported by path (it is a MkDocs hook, not a package module)."""
    spec = importlib.util.spec_from_file_location("kvstore_docs_reference", os.path.join(ROOT, "docs", "hooks",
                                                                                        "reference.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference() -> types.ModuleType:
    return load_reference()


@pytest.fixture(scope="module")
def pages(reference) -> dict[str, str]:
    return reference.generate()


def sections(page: str) -> dict[str, str]:
    """``{"kvstore serve": text of its section}`` for the CLI page's ``## `kvstore serve``` headings."""
    parts = re.split(r"^#{2,4} `([^`]+)`$", page, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def walk(parser: argparse.ArgumentParser, name: str):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from walk(sub, f"{name} {sub_name}")


def readme_first_screen() -> str:
    with open(README) as f:
        return "".join(f.readlines()[:40])


# -- generated references ---------------------------------------------------------------------------------------

def test_every_setting_has_its_flag_key_default_and_help_on_the_settings_page(pages):
    from kvstore.config import SETTINGS

    page = pages["configuration/settings.md"]
    for s in SETTINGS:
        flag = "--" + s.name.replace("_", "-")
        (row,) = [line for line in page.splitlines() if line.startswith(f"| `{flag} ")]
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[1] == f"`{s.name}`" and cells[2] and cells[3], row


def test_every_flag_of_every_command_is_on_the_cli_page(pages):
    from kvstore.cli.main import build_parser
    from kvstore.config import SETTINGS

    by_command = sections(pages["reference/cli.md"])
    for name, parser in walk(build_parser(), "kvstore"):
        if name == "kvstore":
            continue
        text = by_command[name]
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            for option in action.option_strings:
                assert f"`{option}" in text, f"{name} {option} missing from reference/cli.md"
    serve = by_command["kvstore serve"]
    assert all(f"`--{s.name.replace('_', '-')}{'`' if s.switch else ' '}" in serve for s in SETTINGS)


def test_every_metric_series_and_alert_is_on_the_metrics_page(pages):
    from kvstore.metrics.alerts import alert_rules
    from kvstore.metrics.definitions import METRICS

    page = pages["reference/metrics.md"]
    assert all(f"| `{m.sample_name}` | {m.kind} |" in page for m in METRICS)
    assert all(f"| `{rule.alert}` | {rule.severity} |" in page for rule in alert_rules())


def test_every_operation_and_error_code_is_on_the_wire_page(pages):
    from kvstore import errors
    from kvstore.protocol.wire import Op

    page = pages["reference/wire.md"]
    assert all(f"| `{op.name}` | {op.value} |" in page for op in Op)
    assert all(f"| {cls.code} | `{cls.__name__}` |" in page for cls in errors.RequestError.__subclasses__())
    assert "| `CREDIT_PUT` | 18 | publish chunks copied into a put credit" in page   # the source's comment


def test_a_setting_or_metric_added_later_appears_without_an_edit_of_the_docs(reference, monkeypatch):
    from kvstore import config
    from kvstore.metrics import definitions

    added = replace(config.SETTINGS[0], name="future_knob", help="a setting added after these docs", metavar="N")
    monkeypatch.setattr(config, "SETTINGS", config.SETTINGS + (added,))
    metric = replace(definitions.METRICS[0], name="kvstore_future_things", help="a metric added later")
    monkeypatch.setattr(definitions, "METRICS", definitions.METRICS + (metric,))
    assert "| `--future-knob N` | `future_knob` |" in reference.configuration_page()
    assert "| `kvstore_future_things_total` | counter |" in reference.metrics_page()


def test_help_texts_say_what_lease_ttl_and_shutdown_timeout_really_do():
    """The flags' help once said a lease ends at its TTL and the timeout bounds in-flight work, while a live
    local client keeps its leases and the timeout is the budget of the whole stop, shared out by StopPlan."""
    from kvstore.config import SETTINGS
    from kvstore.server.lifecycle.stopping import MAX_BUDGET_S, MIN_BUDGET_S, SHARES

    helps = {s.name: s.help for s in SETTINGS}
    lease = helps["lease_ttl"]
    assert "cannot follow" in lease and "keeps its leases until it releases them" in lease and "overdue" in lease
    stop = helps["shutdown_timeout"]
    assert f"{MIN_BUDGET_S:g}s..{MAX_BUDGET_S:g}s" in stop and "exits 1" in stop
    assert [int(p) for p in re.findall(r"(\d+) %", stop)] == [round(share * 100) for share in SHARES]


# -- the README: one screen that starts and sizes the daemon, links that resolve ---------------------------------

def test_readme_is_short_and_its_first_screen_says_what_the_default_daemon_takes():
    with open(README) as f:
        lines = f.readlines()
    assert len(lines) <= 250
    screen = re.sub(r"\s+", " ", readme_first_screen())
    assert "a quarter of the memory available" in screen and "reserved as chunks are stored" in screen
    assert "`~/.cache/kvstore/chunks`" in screen and "`$XDG_RUNTIME_DIR/kvstore/kvstore.sock`" in screen


def test_readme_links_into_docs_name_pages_that_exist(pages):
    with open(README) as f:
        links = re.findall(r"\]\((docs/[^)#]+)", f.read())
    assert links
    missing = [link for link in links if not os.path.exists(os.path.join(ROOT, link))
               and link.removeprefix("docs/") not in pages]
    assert not missing


def test_readme_snippets_use_the_socket_the_quick_start_daemon_listens_on():
    """The quick start's daemon is a plain `kvstore serve`: no snippet may name another socket (the systemd
    unit's /run/kvstore/kvstore.sock was once in them), so each leaves `address` out and says so."""
    with open(README) as f:
        quick_start = f.read().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    snippets = re.findall(r"```\w*\n(.*?)```", quick_start, flags=re.DOTALL)
    assert len(snippets) == 3 and "vllm serve" in snippets[1] and "sglang" in snippets[1]
    assert not [s for s in snippets if "\"address\"" in s or "ipc://" in s or "kvstore.sock" in s]
    assert "`address` out uses the default socket" in re.sub(r"\s+", " ", quick_start)


def test_nav_names_pages_that_exist_and_every_docs_folder_has_a_section(reference, pages):
    yaml = pytest.importorskip("yaml")
    with open(os.path.join(ROOT, "mkdocs.yml")) as f:
        config = yaml.safe_load(f)

    def files(item):
        if isinstance(item, str):
            yield item
        elif isinstance(item, list):
            for x in item:
                yield from files(x)
        elif isinstance(item, dict):
            for x in item.values():
                yield from files(x)

    listed = list(files(config["nav"]))
    assert [p for p in listed if not os.path.exists(os.path.join(ROOT, "docs", p)) and p not in pages] == []
    folders = {d for d in os.listdir(os.path.join(ROOT, "docs"))
               if os.path.isdir(os.path.join(ROOT, "docs", d)) and d != "hooks"}
    titles = {next(iter(item)) for item in config["nav"] if isinstance(item, dict)}
    assert folders <= set(reference.SECTIONS) and set(reference.SECTIONS.values()) <= titles
    assert config["hooks"] == ["docs/hooks/reference.py"]


# -- the site ------------------------------------------------------------------------------------------------------

def test_the_site_builds_with_mkdocs_strict_and_files_a_new_page_under_its_folder(tmp_path):
    """The real site builds with every warning an error; a copy of it with a page that no nav entry lists
    (as another change adds docs/operations/events.md) builds too and shows that page in Operations."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs-material is not installed: pip install -e '.[docs]'")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}

    def build(config: str, site: str) -> None:
        out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", config, "--site-dir", site],
                             check=False, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
        assert out.returncode == 0, out.stderr[-4000:]

    site = tmp_path / "site"
    build(os.path.join(ROOT, "mkdocs.yml"), str(site))
    settings = (site / "configuration" / "settings" / "index.html").read_text()
    assert "--lease-ttl" in settings and "kvstore_hit_tokens_total" in (site / "reference" / "metrics" /
                                                                         "index.html").read_text()
    assert (site / "reference" / "cli" / "index.html").exists()

    copy = tmp_path / "copy"
    shutil.copytree(os.path.join(ROOT, "docs"), copy / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "mkdocs.yml"), copy)
    (copy / "docs" / "operations" / "unlisted-page.md").write_text("# A page no nav entry lists\n\nText.\n")
    build(str(copy / "mkdocs.yml"), str(tmp_path / "copy-site"))
    home = (tmp_path / "copy-site" / "index.html").read_text()
    operations = re.search(r">\s*Operations\s*<(.*?)>\s*Connectors\s*<", home, flags=re.DOTALL)
    assert operations and "operations/unlisted-page/" in operations.group(1)
    assert "A page no nav entry lists" in operations.group(1)


def written_pages() -> dict[str, str]:
    """The README and every page under docs/ as written (the generated reference pages are checked above)."""
    out = {}
    for folder, _, names in os.walk(os.path.join(ROOT, "docs")):
        for name in names:
            if name.endswith(".md"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    out[os.path.relpath(path, ROOT)] = f.read()
    with open(README) as f:
        out["README.md"] = f.read()
    return out


def module_file(module: str) -> str | None:
    """The file ``python -m module`` runs, found without importing it (an engine's package may be absent):
    ``kvstore.connectors.X`` lives in ``connectors/X``."""
    parts = module.split(".")
    if parts[:2] == ["kvstore", "connectors"]:
        parts = parts[1:]
    base = os.path.join(ROOT, *parts)
    for candidate in (base + ".py", os.path.join(base, "__main__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


# Tops of the repository a page may name a file under, in backticks.
REPO_TOPS = ("kvstore/", "connectors/", "native/", "tests/", "bench/", "docs/", "systemd/", ".ci/")
# Files the install makes in the package (setup.py), absent from a checkout that was not built.
BUILT = re.compile(r"kvstore/native/(_kvstore_\w+\.so|kvstore_copy\.cu)")
# Names of the run-time native build that was replaced by the install's (kvstore/native/, docs/design/native.md).
REMOVED_NAMES = ("kvstore.ops.native", "ops/native_src", "native_walk", "KVSTORE_NATIVE=build", "native.conf",
                 ".cache/kvstore/native")


def test_every_module_the_docs_run_exists():
    missing = [(page, module) for page, text in written_pages().items()
               for module in re.findall(r"python3? -m ((?:kvstore|bench)(?:\.\w+)*)", text)
               if not module.split(".")[-1].isupper() and module_file(module) is None]   # bench.NAME: a blank
    assert not missing


def test_every_repository_file_the_docs_name_exists():
    missing = []
    for page, text in written_pages().items():
        for path in re.findall(r"`([^`\s]+)`", text):
            path = path.split("#")[0].split(":")[0].rstrip(".,")
            if path.startswith(REPO_TOPS) and not re.search(r"[<>*{}…]|NAME", path) \
                    and not os.path.exists(os.path.join(ROOT, path)) and not BUILT.fullmatch(path):
                missing.append((page, path))
    assert not missing


def test_every_kvstore_variable_the_docs_name_is_read_by_the_code():
    code = []
    for top in ("kvstore", "connectors", "tests", "bench", ".ci"):
        for folder, _, names in os.walk(os.path.join(ROOT, top)):
            for name in names:
                if name.endswith((".py", ".sh")) or top == ".ci":
                    with open(os.path.join(folder, name), errors="replace") as f:
                        code.append(f.read())
    source = "\n".join(code)
    named = {(page, var) for page, text in written_pages().items() for var in re.findall(r"\bKVSTORE_[A-Z0-9_]+", text)}
    assert named and not [(page, var) for page, var in named if var not in source]


def test_no_page_names_the_native_build_that_was_removed():
    stale = [(page, name) for page, text in written_pages().items() for name in REMOVED_NAMES if name in text]
    assert not stale


def test_no_page_names_a_path_of_one_machine():
    local = [(page, m) for page, text in written_pages().items()
             for m in re.findall(r"(?<![\w.])/(?:work|home)/\S+", text)]
    assert not local
