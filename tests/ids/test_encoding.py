"""Ids and tokens (``leases.ids``)."""

from __future__ import annotations

from io import StringIO

from django.core.management import call_command

from leases import ids


def test_given_many_new_tokens_then_none_starts_with_a_dash_and_all_are_distinct():
    # One token_urlsafe in 64 starts with "-", which argparse takes for an option: 5,000
    # tokens would hold about 78 such.
    tokens = [ids.new_token() for _ in range(5000)]
    assert not [t for t in tokens if t.startswith("-")]
    assert len(set(tokens)) == len(tokens) and {len(t) for t in tokens} == {32}


def test_given_a_token_from_new_token_then_the_cli_takes_it_as_the_argument():
    # Given: a token that would start with a dash had it not been made by new_token, the CLI
    # reads any new token as its positional argument (an unknown one answers "not found").
    out = StringIO()
    for token in [ids.new_token() for _ in range(200)]:
        try:
            call_command("lease", "show", token, stdout=out, stderr=out)
        except SystemExit:  # a missing token exits non-zero; the argument was parsed all the same
            pass
        except Exception as exc:  # noqa: BLE001 - the check is on argument parsing only
            assert "arguments are required" not in str(exc), token
