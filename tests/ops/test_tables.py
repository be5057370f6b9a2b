"""leases.ops.tables and leases.ops.reports: the CLI's plain-text forms (pure functions)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from leases.ops import reports, tables


def test_given_rows_then_the_table_aligns_columns_and_right_aligns_numbers():
    text = tables.table(["NAME", "N"], [("a", 5), ("long-name", 10), ("none", None)], numeric=["N"])

    assert text.splitlines() == [
        "NAME        N",
        "---------  --",
        "a           5",
        "long-name  10",
        "none        -",
    ]


def test_given_times_and_seconds_then_each_has_one_form():
    assert tables.when(datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02 03:04:05" and tables.when(None) == "-"
    assert tables.seconds(12.7) == "12s" and tables.seconds(-3.2) == "expired 3s" and tables.seconds(None) == "-"


def test_given_json_output_then_naive_times_are_utc_and_sets_are_lists():
    data = {"at": datetime(2026, 1, 2, 3, 4, 5), "aware": datetime(2026, 1, 2, tzinfo=UTC), "s": (1, 2)}

    assert json.loads(json.dumps(data, default=tables.json_default)) == {
        "at": "2026-01-02T03:04:05Z", "aware": "2026-01-02T00:00:00+00:00", "s": [1, 2]}


def test_given_a_reconcile_result_then_the_text_says_whether_more_remains():
    assert reports.reconciled({"corrected": 2, "rounds": 1, "hasMore": False}) == \
        "Reconcile: 2 counter(s) corrected or removed."
    assert reports.reconciled({"corrected": 0, "rounds": 100, "hasMore": True}).endswith("; more remain.")
    assert reports.weight_set("tex", "acme", None) == "Tenant acme now weighs 1 (default) on lease tex (System layer; audited)."
