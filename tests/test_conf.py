"""leases.conf: every LEASES_* setting has a default and is read one way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.test import override_settings

from leases.conf import DEFAULTS, lease_settings

PACKAGE = Path(__file__).resolve().parent.parent / "leases"


def _sources() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if p.name != "conf.py"]


def test_given_a_setting_the_host_did_not_set_when_read_then_its_default_answers(settings):
    del settings.LEASES_TICKET_TTL_MS
    assert lease_settings.TICKET_TTL_MS == DEFAULTS["TICKET_TTL_MS"] == 3000


def test_given_an_override_when_read_then_the_host_value_answers():
    with override_settings(LEASES_TICKET_TTL_MS=1234):
        assert lease_settings.TICKET_TTL_MS == 1234
    assert lease_settings.TICKET_TTL_MS != 1234


def test_given_an_unknown_name_when_read_then_attribute_error_names_it():
    with pytest.raises(AttributeError, match="NO_SUCH_THING"):
        lease_settings.NO_SUCH_THING  # noqa: B018 - the read is the test


def test_given_the_package_when_scanned_then_no_module_reads_lease_settings_around_conf():
    direct = re.compile(r"settings\.LEASES_|getattr\(\s*settings\s*,\s*[\"']LEASES_")
    offenders = [str(p.relative_to(PACKAGE)) for p in _sources() if direct.search(p.read_text())]
    assert offenders == []


def test_given_the_package_when_scanned_then_every_setting_it_reads_has_a_default():
    used = set()
    for path in _sources():
        used |= set(re.findall(r"lease_settings\.([A-Z][A-Z0-9_]+)", path.read_text()))
    assert used, "the scan found no reads at all"
    assert used - set(DEFAULTS) - {"MONGODB_URI"} == set()
