"""The OpenAPI document is true: schemathesis drives the RUNNING app (gunicorn process).

Requests are generated from ``GET /api/v1/openapi.json`` (valid and invalid ones) and
every live answer is validated against the document: documented status codes, content
types, headers and response schemas; no server errors; invalid input is rejected.
"""

from __future__ import annotations

import os
import uuid

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from leases.api import keys, openapi
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.store import client as store
from tests.helpers import ensure_tenant
from tests.http_server import running_server

# Per operation and mode; raise it locally (OPENAPI_MAX_EXAMPLES=500) for a deeper search.
MAX_EXAMPLES = int(os.environ.get("OPENAPI_MAX_EXAMPLES", "30"))


@pytest.fixture(scope="module")
def server(django_db_setup):
    # Generated definitions ask for long waits; a short bound keeps busy answers quick.
    with running_server(workers=2, env={"LEASES_HTTP_MAX_WAIT_MS": "100"}) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(f"{server}/api/v1/openapi.json")


@pytest.fixture
def bearer():
    ensure_tenant("acme")
    return {"Authorization": f"Bearer {keys.create_key(tenant_id='acme', name='contract', acting_user='test')[1]}"}


# pytest 9 removed the node attribute schemathesis' pytest plugin (from_fixture) rewrites,
# so operations are parametrized here and driven with their hypothesis strategies.
_PATHS = openapi.document()["paths"]
CASES = [
    pytest.param(path, method.upper(), mode, id=f"{method.upper()} {path} {mode.value}")
    for path, item in _PATHS.items()
    for method, operation in item.items() if method != "parameters"
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    # An operation without any input cannot be sent invalid data.
    if mode is GenerationMode.POSITIVE or "requestBody" in operation or "parameters" in item
]


def _refused_class(case, response) -> bool:
    """A schema-valid ``priority`` the lease's definition does not name: the document says
    it answers 400 INVALID_REQUEST, and no schema can know a definition's classes."""
    body = case.body if isinstance(case.body, dict) else {}
    if response.status_code != 400 or body.get("priority") is None:
        return False
    detail = response.json().get("detail", "")
    return response.json().get("code") == "INVALID_REQUEST" and repr(body["priority"]) in detail and (
        "priority" in detail)


@pytest.mark.parametrize("path,method,mode", CASES)
def test_given_generated_requests_when_sent_to_the_running_app_then_answers_conform_to_the_document(
        server, api_schema, bearer, path, method, mode):
    operation = api_schema[path][method]
    session = requests.Session()
    statuses: list[int] = []

    @given(case=operation.as_strategy(generation_mode=mode))
    # CI runs a fixed example sequence (a landing must not depend on luck); local runs explore.
    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None,
              derandomize=os.environ.get("CI") == "true")
    def run(case):
        # positive_data_acceptance expects 2xx/404 for valid input; this protocol answers a
        # schema-valid but unknown token with the documented terminal 410 instead. Its
        # intent is kept below: schema-valid input is never refused as bad input (400).
        response = case.call_and_validate(base_url=server, session=session, headers=bearer,
                                          excluded_checks=[schemathesis.checks.positive_data_acceptance])
        if mode is GenerationMode.POSITIVE and not _refused_class(case, response):
            assert response.status_code != 400, (case.body, response.text)
        statuses.append(response.status_code)

    run()
    assert statuses, "no request was generated"
    # Invalid input is checked by schemathesis' negative_data_rejection on every answer.


def test_given_a_real_lease_lifecycle_when_validated_then_every_answer_conforms(server, api_schema, bearer):
    """Generated tokens are unknown (410); this walks the happy path through the same checks."""
    session = requests.Session()
    session.headers.update(bearer)
    acquire = api_schema["/api/v1/leases"]["POST"]
    case = acquire.Case(body={"type": "tex", "projectId": "p1", "userId": "u1",
                              "inline": {"name": "contract", "levels": {"user": 1}, "ttlSeconds": 30}})
    response = case.call(base_url=server, session=session)
    case.validate_response(response)
    assert response.status_code == 201
    token = response.json()["token"]
    busy = acquire.Case(body={**case.body, "waitMs": 0}).call(base_url=server, session=session)
    acquire.Case(body={**case.body, "waitMs": 0}).validate_response(busy)
    assert busy.status_code == 429 and busy.json()["level"] == "user"
    for path, method, body, status in [
        ("/api/v1/leases/{token}/renew", "POST", {"proposedIntervalSeconds": 5}, 200),
        ("/api/v1/leases/{token}/payload", "PUT", {"payload": {"jobId": "j-1", "n": [1, 2.5, None]}}, 200),
        ("/api/v1/leases/{token}", "DELETE", None, 200),
        ("/api/v1/leases/{token}", "DELETE", None, 200),
        ("/api/v1/leases/{token}/renew", "POST", {}, 410),
    ]:
        extra = {} if body is None else {"body": body}
        step = api_schema[path][method].Case(path_parameters={"token": token}, **extra)
        answer = step.call(base_url=server, session=session)
        step.validate_response(answer)
        assert answer.status_code == status, (path, method, answer.text)
    assert store.holders().count_documents({}) == 0


def test_given_a_ticket_lifecycle_when_validated_then_every_answer_conforms(server, api_schema, bearer):
    """202 ticket → poll 200 → grant 201 → poll 201 again → DELETE 204 → DELETE 200 → poll 410,
    and an abandoned second ticket, all through the document's checks."""
    name = f"contract-{uuid.uuid4().hex[:8]}"  # the server process caches definitions by name
    config.put_document("_vance", "_tenant", document_path(name), "levels: {global: 1}\nttlSeconds: 30\n")
    session = requests.Session()
    session.headers.update(bearer)
    acquire = api_schema["/api/v1/leases"]["POST"]
    ticket_ops = api_schema["/api/v1/tickets/{ticket}"]
    body = {"type": "tex", "projectId": "p1", "userId": "u1", "lease": name}

    def send(operation, expected, **kwargs):
        case = operation.Case(**kwargs)
        answer = case.call(base_url=server, session=session)
        case.validate_response(answer)
        assert answer.status_code == expected, answer.text
        return answer

    held = send(acquire, 201, body=body).json()
    ticket = send(acquire, 202, body={**body, "userId": "u2", "waitMs": 50}).json()["ticket"]
    other = send(acquire, 202, body={**body, "userId": "u3", "waitMs": 50}).json()["ticket"]
    assert send(ticket_ops["GET"], 200, path_parameters={"ticket": ticket}).json()["position"] == 1
    send(api_schema["/api/v1/leases/{token}"]["DELETE"], 200, path_parameters={"token": held["token"]})
    grant = send(ticket_ops["GET"], 201, path_parameters={"ticket": ticket}).json()
    assert send(ticket_ops["GET"], 201, path_parameters={"ticket": ticket}).json() == grant
    send(ticket_ops["DELETE"], 204, path_parameters={"ticket": ticket})
    send(ticket_ops["DELETE"], 200, path_parameters={"ticket": ticket})
    send(ticket_ops["GET"], 410, path_parameters={"ticket": ticket})
    send(ticket_ops["DELETE"], 204, path_parameters={"ticket": other})
    send(ticket_ops["GET"], 410, path_parameters={"ticket": other})
    assert store.holders().count_documents({}) == 0


def _acquire_body_validator():
    import jsonschema_rs

    doc = openapi.document()
    return jsonschema_rs.Draft202012Validator({**doc, "$ref": "#/components/schemas/AcquireRequest"})


@pytest.mark.parametrize("user", ["alice.smith", "bob@example.com", "c+d", "e" * 150, "ünï", "a/b", "x|y", "100%",
                                  "", " ", "a b", "e" * 151, "tab\there", "zw\u200bsp", "nb\u00a0sp"])
def test_given_a_user_id_then_the_document_and_the_server_agree_on_it(user):
    from leases.errors import InvalidLeaseRequest
    from leases.ids import validation

    try:
        validation.user_id(user)
        accepted = True
    except InvalidLeaseRequest:
        accepted = False
    body = {"type": "tex", "projectId": "p1", "userId": user}
    assert _acquire_body_validator().is_valid(body) is accepted


@pytest.mark.parametrize("body, valid", [
    ({"inline": {"name": "x", "levels": {"user": 1}}, "priority": "high"}, False),
    ({"inline": {"name": "x"}, "priority": "high"}, False),
    ({"inline": {"name": "x"}, "priority": None}, True),
    ({"inline": None, "lease": "tex", "priority": "high"}, True),
    ({"lease": "tex", "priority": "high"}, True),
])
def test_given_an_inline_definition_with_a_priority_then_the_document_refuses_it_like_the_server(body, valid):
    assert _acquire_body_validator().is_valid({"type": "tex", "projectId": "p1", "userId": "u1", **body}) is valid


def test_given_the_document_then_every_problem_answer_lists_its_codes_and_unknown_lease_is_one():
    doc = openapi.document()
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            if method == "parameters" or path.endswith("openapi.json"):
                continue
            for status, response in operation["responses"].items():
                if status in ("400", "401", "403", "503"):
                    schema = response["content"]["application/problem+json"]["schema"]
                    assert schema["allOf"][1]["properties"]["code"]["enum"], (path, method, status)
    acquire_400 = doc["paths"]["/api/v1/leases"]["post"]["responses"]["400"]
    assert "UNKNOWN_LEASE" in acquire_400["content"]["application/problem+json"]["schema"]["allOf"][1][
        "properties"]["code"]["enum"]
