"""leases.errors: the one hierarchy every raised error of the package belongs to."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from leases import errors

ERRORS = Path(errors.__file__).parent  # the package that holds the hierarchy
PACKAGES = [ERRORS.parent, ERRORS.parent.parent / "insights"]


def _hierarchy() -> list[type[errors.LeaseError]]:
    found, pending = [], [errors.LeaseError]
    while pending:
        cls = pending.pop()
        if cls not in found:  # ApiKeyRejected is reached through both of its bases
            found.append(cls)
            pending.extend(cls.__subclasses__())
    return [cls for cls in found if cls.__module__ == errors.__name__]


def test_given_the_package_sources_then_no_module_but_errors_defines_an_error_class():
    names = {cls.__name__ for cls in _hierarchy()} | {"Exception", "RuntimeError", "ValueError", "LookupError"}
    offenders = []
    for root in PACKAGES:
        for path in root.rglob("*.py"):
            if path.parent == ERRORS or "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                    continue  # private control-flow exceptions never leave their module
                bases = {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
                if bases & names:
                    offenders.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name}")
    assert offenders == []


def test_given_every_error_class_then_each_code_names_one_condition():
    by_code: dict[str, list[str]] = {}
    for cls in _hierarchy():
        by_code.setdefault(cls.code, []).append(cls.__name__)
    shared = {code: sorted(names) for code, names in by_code.items() if len(names) > 1}
    # The client's 401 is a view of the server's Unauthenticated, not a second condition.
    assert shared == {"UNAUTHENTICATED": ["ApiKeyRejected", "Unauthenticated"]}


@pytest.mark.parametrize("cls", _hierarchy(), ids=lambda cls: cls.__name__)
def test_given_a_code_when_looking_it_up_then_the_class_that_owns_it_is_answered(cls):
    owner = errors.by_code(cls.code)
    assert owner is not None and issubclass(cls, owner) and owner.code == cls.code
    assert inspect.getdoc(cls), f"{cls.__name__} has no docstring"


def test_given_an_unknown_code_then_by_code_answers_none():
    assert errors.by_code("NO_SUCH_CODE") is None
    assert errors.by_code("") is None


def test_given_a_revoked_session_then_it_is_a_lost_lease_with_its_own_code():
    revoked = errors.SessionRevoked("closed")
    assert isinstance(revoked, errors.LeaseLost) and revoked.code == "SESSION_REVOKED"
    assert errors.LeaseLost.code == "LEASE_LOST"


def test_given_a_busy_error_then_retry_after_is_an_attribute_of_the_class():
    busy = errors.LeaseBusy(resource="r", level="user", scope="acme/u1", count=1, cap=1, retry_after=2.5)
    assert busy.retry_after == 2.5 and busy.position is None
    # Never None: without a suggestion the floor the HTTP Retry-After also has.
    assert errors.LeaseBusy(resource="r", level="user", scope="s", count=None, cap=1).retry_after == 1.0
    assert errors.LeaseRetriesExhausted(retries=3, resource="r").retry_after == 1.0


@pytest.mark.parametrize("code, status", [("FORBIDDEN", 403), ("NOT_FOUND", 404), ("METHOD_NOT_ALLOWED", 405),
                                          ("INTERNAL_ERROR", 500)])
def test_given_an_http_layer_code_then_its_class_is_an_http_problem_with_the_status_the_server_answers(code, status):
    cls = errors.by_code(code)
    assert cls is not None and issubclass(cls, errors.HttpProblem) and cls.http_status == status
    assert cls("x").status == status and cls("x", status=418).status == 418


def test_given_the_package_sources_then_no_module_but_errors_spells_an_error_code_literally():
    codes = {cls.code for cls in _hierarchy()}
    package = ERRORS.parent
    # The client decodes answers by status and code; a pod lease's outcomes (STALE_LEASE,
    # EXPIRED) are answers of the pod registry, not errors.
    allowed = {*ERRORS.glob("*.py"), package / "client" / "answers.py", package / "pods" / "leases.py"}
    offenders = []
    for root in PACKAGES:
        for path in root.rglob("*.py"):
            if path in allowed or "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in codes:
                    offenders.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.value}")
    assert offenders == []


def test_given_a_class_defined_in_a_submodule_then_its_public_name_is_leases_errors():
    # given: the hierarchy split over modules by who raises it
    # then: every class answers to leases.errors.<Name> (tracebacks, pickles, by_code)
    import pickle

    assert {cls.__module__ for cls in _hierarchy()} == {"leases.errors"}
    assert len(_hierarchy()) == len(errors.__all__) - 1  # every class, plus by_code
    lost = pickle.loads(pickle.dumps(errors.LeaseExpired("gone", reason="idle")))
    assert type(lost) is errors.LeaseExpired and str(lost) == "gone"
