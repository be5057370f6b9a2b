"""Before anything is written: validate the request and resolve the definition it uses.

The answer is the attempt and its wait bound, or None for ``NOOP`` (no lease referenced, a
definition without caps, or a name no layer defines under ``LEASES_UNDEFINED_LEASE =
"noop"``). Shared by the sync and the async acquire.
"""

from __future__ import annotations

from ..conf import lease_settings
from ..definitions import model as definitions, undefined
from ..definitions.model import LeaseDefinition
from ..errors import InvalidLeaseRequest, LeaseUnavailable, UnknownLease
from ..pods import process as pod_process
from ..pods.identity import self_pod_id
from ..telemetry import metrics
from .funnel import Attempt
from .request import LeaseRequest


def resolve_definition(request: LeaseRequest) -> LeaseDefinition | None:
    """The definition an acquisition of ``request`` uses; ``None`` when no lease is referenced.

    Raises:
        InvalidDefinition: a refused inline definition.
        LeaseUnavailable: broken or unreadable configuration.
    """
    if request.inline is not None:
        return definitions.inline_definition(request.inline, request.tenant_id, request.project_id)
    if request.lease is None or request.lease == "":
        return None
    return definitions.resolve(request.lease, request.tenant_id, request.project_id)

def prepare(request: LeaseRequest) -> "tuple[Attempt, int] | None":
    """Validate the request and resolve its definition: the attempt and its wait bound, or
    None for NOOP (no lease referenced, or no caps). Shared by the sync and async acquire.

    Raises:
        InvalidLeaseRequest, LeaseUnavailable: as :func:`acquire` (nothing written).
    """
    if not isinstance(request, LeaseRequest):
        raise InvalidLeaseRequest("acquire() takes a LeaseRequest")
    request.validated()
    try:
        definition = resolve_definition(request)
    except LeaseUnavailable:
        metrics.ACQUIRE.labels(resource=metrics.INLINE_RESOURCE_TAG if request.inline else metrics.UNDEFINED_TAG,
                               outcome="unavailable").inc()
        raise
    if definition is not None and definition.is_noop and definition.priorities and request.priority is not None:
        # Nothing waits here, but where the lease names classes a misspelt or forbidden one
        # must fail where it is written, not first on the day an operator adds a cap (no
        # command). A name no layer defines stays NOOP whatever the request says.
        definition.priority_of(request.tenant_id, request.priority)
    if definition is not None and not definition.defined:
        # A name no layer defines (a typo?): recorded for Insights and `lease undefined`
        # (rate-limited; a defined lease never gets here), then NOOP or refused per setting.
        undefined.record(definition.name, request.tenant_id, request.project_id)
        if lease_settings.UNDEFINED_LEASE != "noop":  # "error", or any bad value: fail closed
            raise UnknownLease(f"lease {definition.name!r} is not defined in any layer "
                               f"(LEASES_UNDEFINED_LEASE = {lease_settings.UNDEFINED_LEASE!r})")
    if definition is None or definition.is_noop:
        metrics.ACQUIRE.labels(resource=metrics.definition_tag(definition), outcome="noop").inc()
        return None
    specs = definition.level_specs(request.tenant_id, request.project_id, request.user_id)
    if request.pod is None:
        pod_process.ensure_pod()  # this process's pod must be alive before a holder names it
    pod = self_pod_id() if request.pod is None else request.pod
    wait_ms = definition.wait_ms if request.wait_ms is None else min(request.wait_ms, definition.wait_ms)
    return Attempt(request, definition, specs, pod), wait_ms
