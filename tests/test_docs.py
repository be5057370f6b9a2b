"""The documentation cannot drift from the code.

* The reference names everything the code defines: every ``LEASES_*`` setting, every system
  check id, every error class and code, every HTTP operation, every management command and
  action, every metric series and every definition field appears in what
  ``scripts/gen_reference.py`` generates. The names are read here independently of the
  generator (from the source or the live objects), so a generator that drops one fails.
* Every ```` ```python ```` block of the site (``docs/**/*.md``) and of the README runs, page by
  page in one namespace and in order, against the test store; a block that includes a file
  (``--8<-- "path"``) must name an existing file (the file is run by the test that owns it).
* Every ```` ```yaml ```` block that names a definition layer in its first comment parses as
  that layer.
* The README stays short and shows the commands the issue asked for.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib.util
import io
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.M | re.S)
INCLUDE = re.compile(r'^--8<-- "([^"]+)"$')


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", REPO / "scripts" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference() -> dict[str, str]:
    return _generator().pages()


def _pages() -> list[Path]:
    """The hand-written pages (the generated reference is checked by the tests above)."""
    generated = {DOCS / "reference" / f"{name}.md" for name in _generator().GENERATED}
    return [REPO / "README.md"] + sorted(p for p in DOCS.rglob("*.md") if p not in generated)


def _blocks(path: Path, language: str) -> list[tuple[str, str]]:
    """The fenced blocks of ``language`` in ``path``: (attributes, body)."""
    return [(m.group(2), m.group(3)) for m in FENCE.finditer(path.read_text()) if m.group(1) == language]


# --- the reference --------------------------------------------------------------------------------

def test_the_settings_reference_names_every_setting_and_check(reference):
    from leases.conf import DEFAULTS

    page = reference["reference/settings.md"]
    for name in DEFAULTS:
        assert f"`LEASES_{name}`" in page, name
    ids = set(re.findall(r'id="(leases\.[EW]\d+)"', (REPO / "leases" / "checks.py").read_text()))
    assert len(ids) >= 15
    for ident in ids:
        assert f"`{ident}`" in page, ident


def test_the_environment_reference_names_every_variable_the_example_project_reads(reference):
    source = (REPO / "config" / "settings.py").read_text()
    variables = set(re.findall(r'(?:os\.environ\.get|_env_int|_env_bool|_env_list)\(\s*"([A-Z_]+)"', source))
    assert {"MONGODB_DB", "DJANGO_SECRET_KEY", "CELERY_BROKER_URL"} <= variables
    page = reference["reference/environment.md"]
    for variable in variables:
        assert f"`{variable}`" in page, variable
    # The app's settings are a page of their own: the environment page lists no setting that
    # only a host's settings.py can set.
    assert "`LEASES_TENANT_ACCESS`" not in page


def test_the_errors_reference_names_every_class_code_and_status(reference):
    import leases.errors as errors
    from leases.api import problems

    page = reference["reference/errors.md"]
    classes = [getattr(errors, n) for n in errors.__all__ if isinstance(getattr(errors, n), type)]
    assert len(classes) >= 40
    for cls in classes:
        assert f"`{cls.__name__}`" in page and f"`{cls.code}`" in page, cls
    for cls, status, _title in problems._STATUS:
        row = next(line for line in page.splitlines() if line.startswith(f"| `{cls.code}` |"))
        assert f"| {status} |" in row, (cls, row)


def test_the_http_reference_names_every_operation_and_status(reference):
    from leases.api import openapi

    page = reference["reference/http-api.md"]
    document = openapi.document()
    operations = 0
    for path, item in document["paths"].items():
        for method, op in item.items():
            if method == "parameters":
                continue
            operations += 1
            assert f"`{method.upper()} {path}`" in page and f"`{op['operationId']}`" in page, (method, path)
            for status in op["responses"]:
                assert f"`{status}`" in page
    assert operations >= 7
    for name in document["components"]["schemas"]:
        assert f"### `{name}`" in page, name


def test_the_cli_reference_shows_every_command_and_action(reference):
    page = reference["reference/cli.md"]
    commands = [p.stem for p in (REPO / "leases").rglob("management/commands/*.py") if p.stem != "__init__"]
    assert {"lease", "lease_config", "apikey"} <= set(commands)
    for command in commands:
        assert f"## `{command}`" in page, command
        actions = re.findall(r'add_parser\(\s*"([a-z-]+)"', next(
            p for p in (REPO / "leases").rglob(f"management/commands/{command}.py")).read_text())
        for action in actions:
            assert f"### `{command} {action}`" in page, (command, action)
    # f-string parsers (revoke / revoke-pod) are there too.
    assert "### `lease revoke-pod`" in page and "usage: manage.py lease sweep" in page


def test_the_metrics_reference_names_every_series_and_label(reference):
    from prometheus_client.metrics import MetricWrapperBase

    from leases.telemetry import metrics

    page = reference["reference/metrics.md"]
    found = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    assert len(found) >= 10
    for metric in found:
        for sample in metric.describe()[0].samples or ():
            assert sample.name in page
        family = metric.describe()[0]
        assert f"`{family.name}`" in page, family.name
        for label in metric._labelnames:
            assert f"`{label}`" in page, label
    assert f"`{metrics.PREFIX}fence_rejected_total`" in page


def test_the_definitions_reference_names_every_field_and_bundled_definition(reference):
    from leases.definitions import schema

    page = reference["reference/definitions.md"]
    for field in schema.FIELD_OWNERS:
        assert f"`{field}`" in page, field
    for path in (REPO / "leases" / "defaults").rglob("*.yaml"):
        assert path.read_text().rstrip() in page, path


def test_the_python_reference_names_the_public_api(reference):
    import leases

    page = reference["reference/python-api.md"]
    for name in leases.__all__:
        assert f"## `leases.{name}`" in page, name


def test_the_generated_pages_are_all_in_the_navigation():
    nav = (REPO / "mkdocs.yml").read_text()
    for name in _generator().GENERATED:
        assert f"reference/{name}.md" in nav, name


# --- the snippets ---------------------------------------------------------------------------------

PYTHON_PAGES = [p for p in _pages() if _blocks(p, "python")]


def _run_page(path: Path) -> str:
    namespace: dict[str, object] = {"__name__": f"docs_{path.stem.replace('-', '_')}"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for number, (_attrs, body) in enumerate(_blocks(path, "python"), 1):
            include = INCLUDE.match(body.strip())
            if include:
                assert (REPO / include.group(1)).is_file(), f"{path.name} block {number} includes a missing file"
                continue
            code = compile(body, f"{path.relative_to(REPO)} (python block {number})", "exec")
            exec(code, namespace)  # noqa: S102 - the documentation's own examples
    return out.getvalue()


@pytest.mark.parametrize("path", PYTHON_PAGES, ids=[str(p.relative_to(REPO)) for p in PYTHON_PAGES])
def test_every_python_block_runs(path, settings):
    from leases.revocation import handlers

    before = set(handlers.registered_types())
    try:
        printed = _run_page(path)
    finally:
        for kind in set(handlers.registered_types()) - before:  # a page that registers its own handler
            handlers.unregister_handler(kind)
        with contextlib.suppress(RuntimeError):
            asyncio.get_event_loop_policy().set_event_loop(None)
    assert "Traceback" not in printed


def test_the_snippets_show_what_the_pages_say_they_print():
    """The tutorial's busy answer prints what its text says it prints."""
    printed = _run_page(DOCS / "tutorial.md")
    assert "holding " in printed and "bob waited " in printed
    assert "LEASE_BUSY project acme/docs 1/1 retry after" in printed
    assert "refused: STALE_FENCE" in _run_page(DOCS / "how-to" / "fencing.md")


def test_every_definition_yaml_block_parses_as_its_layer():
    from leases.definitions import schema

    checked = 0
    for path in _pages():
        for _attrs, body in _blocks(path, "yaml"):
            first = body.splitlines()[0] if body.strip() else ""
            match = re.match(r"#\s*(\S+)/config/lease/([\w-]+)\.yaml in the (\w+) layer", first)
            if not match:
                continue
            schema.parse_layer(body, match.group(2), match.group(3).lower())
            checked += 1
    assert checked >= 1


def test_every_python_block_parses_and_no_page_skips_one():
    for path in _pages():
        text = path.read_text()
        assert "no-run" not in text and "doctest: +SKIP" not in text, path
        for _attrs, body in _blocks(path, "python"):
            if not INCLUDE.match(body.strip()):
                ast.parse(body)


def _manage_py_lines() -> list[tuple[str, str, list[str]]]:
    """Every ``manage.py <command> …`` typed in a shell block of the site or the README:
    (page, line, argv after ``manage.py``); ``$VAR`` stands for a value, a pipe, redirect,
    comment or closing parenthesis ends the command. The tutorial's host project's commands
    (``/tmp/host/…``) are left to tests/test_adoption.py, which types them."""
    import shlex

    found = []
    for path in _pages():
        for language in ("bash", "console", "sh"):
            for _attrs, body in _blocks(path, language):
                for line in body.splitlines():
                    if "manage.py " not in line or line.lstrip().startswith("#") or "/tmp/host/" in line:
                        continue  # the tutorial's host project: tests/test_adoption.py types those
                    rest = line.split("manage.py ", 1)[1]
                    lexer = shlex.shlex(rest, posix=True, punctuation_chars="|&;()<>")
                    lexer.whitespace_split = True
                    lexer.commenters = "#"
                    argv: list[str] = []
                    try:
                        for token in lexer:
                            if token and set(token) <= set("|&;()<>"):
                                break
                            argv.append("x" if token.startswith("$") else token)
                    except ValueError:  # an open quote: a shell -c string over several lines
                        argv = ["shell", "-c", "pass"] if rest.startswith("shell -c") else argv
                    found.append((str(path.relative_to(REPO)), line.strip(), argv))
    return found


def test_every_manage_py_command_on_the_site_parses():
    """Each command typed on the site is one its command accepts (argparse of the real command)."""
    from django.core.management import get_commands, load_command_class
    from django.core.management.base import CommandError

    commands = get_commands()
    lines = _manage_py_lines()
    assert len(lines) >= 20
    for page, line, argv in lines:
        assert argv and argv[0] in commands, (page, line)
        parser = load_command_class(commands[argv[0]], argv[0]).create_parser("manage.py", argv[0])
        try:
            parser.parse_args(argv[1:])
        except (CommandError, SystemExit) as exc:
            raise AssertionError(f"{page}: {line}\n{exc}") from None


# --- the README -----------------------------------------------------------------------------------

def test_the_readme_is_short_and_shows_the_commands():
    readme = (REPO / "README.md").read_text()
    assert readme.startswith("# django-leases")  # the wheel's long description (tests/test_adoption.py)
    assert len(readme.splitlines()) <= 250
    for command in ("bash scripts/dev.sh", "bash scripts/test.sh", ".venv/bin/mkdocs serve"):
        assert command in readme, command
    for link in re.findall(r"\]\(((?!https?:)[^)#]+)", readme):
        assert (REPO / link).exists(), link
