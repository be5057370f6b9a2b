"""MkDocs hooks (``hooks:`` in mkdocs.yml): the reference pages are written from the code before
every build, so ``mkdocs build --strict`` (CI) and ``mkdocs serve`` never show a stale
reference. See scripts/gen_reference.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_reference  # noqa: E402


def on_pre_build(config, **kwargs):
    gen_reference.write(config["docs_dir"])
