"""Outcome accounting of an acquisition: the metrics and the history of grants and Busy."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import LeaseBusy, LeaseUnavailable
from ..telemetry import history, metrics
from .funnel import Attempt
from .lease import Lease


@contextmanager
def outcome(attempt: "Attempt") -> Iterator[Any]:
    """Count an acquisition's outcome (metrics, history); yields ``record(result)`` for a
    result that came back, and counts Busy and Unavailable as they pass."""
    definition, request = attempt.definition, attempt.request
    tag = metrics.resource_tag(definition.resource)

    def record(result: Any) -> Any:
        if isinstance(result, Lease):
            metrics.ACQUIRE.labels(resource=tag, outcome="success").inc()
            history.grant(definition.resource, request.tenant_id)
        return result

    try:
        yield record
    except LeaseBusy:
        metrics.ACQUIRE.labels(resource=tag, outcome="busy").inc()
        history.busy(definition.resource, request.tenant_id)
        raise
    except LeaseUnavailable:
        metrics.ACQUIRE.labels(resource=tag, outcome="unavailable").inc()
        raise
