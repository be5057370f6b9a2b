"""Forms of Insights → Leases: they parse and validate; the services decide.

Every id a user types is checked with :mod:`leases.ids.validation` here, so a malformed filter
becomes a form error instead of reaching a query.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms

from leases.definitions.model import TENANT_PROJECT
from leases.errors import InvalidLeaseRequest
from leases.ids import validation


def _engine_validator(check: Callable[..., str], *args: Any, max_length: int | None = None) -> Callable[[str], None]:
    def validate(value: str) -> None:
        if value in (None, ""):
            return
        if max_length is not None and len(value) > max_length:
            # The length error says it; the engine's message would echo the whole value.
            return
        try:
            check(value, *args)
        except InvalidLeaseRequest as exc:
            raise forms.ValidationError(str(exc), code=getattr(exc, "code", "invalid")) from None

    return validate


def _filter_field(label: str, check: Callable[..., str], *args: Any, max_length: int) -> forms.CharField:
    # ``max_length`` is the engine's own limit for the id, so a longer value is refused
    # with a short message instead of being echoed back into the page.
    return forms.CharField(
        label=label, required=False, max_length=max_length, strip=True,
        validators=[_engine_validator(check, *args, max_length=max_length)],
        error_messages={"max_length": f"{label} is too long: at most {max_length} characters."},
        widget=forms.TextInput(attrs={"placeholder": "any", "autocomplete": "off"}),
    )


class HolderFilterForm(forms.Form):
    """Filters of the holder table (all optional) and the page number."""

    resource = _filter_field("Resource", validation.resource_name, max_length=128)
    type = _filter_field("Type", validation.lease_name, max_length=64)
    pod = _filter_field("Pod", validation.pod_id, max_length=128)
    project = _filter_field("Project", validation.entity_id, "project id", max_length=64)
    user = _filter_field("User", validation.user_id, max_length=validation.USER_ID_MAX)
    # A counter key: the holders that book a slot of it (the Counters page links here).
    counter = _filter_field("Books counter", validation.counter_key, max_length=validation.COUNTER_KEY_MAX)
    page = forms.IntegerField(
        label="Page", required=False, min_value=1, max_value=1_000_000, widget=forms.HiddenInput,
        error_messages=dict.fromkeys(("invalid", "min_value", "max_value"), "Page must be a whole number from 1 to 1000000."),
    )

    FILTERS = ("resource", "type", "pod", "project", "user", "counter")

    def service_filters(self) -> dict[str, Any]:
        """Keyword arguments for :func:`leases.ops.reads.list_holders` (valid form only)."""
        data = self.cleaned_data
        return {
            "resource": data.get("resource") or None,
            "type": data.get("type") or None,
            "pod": data.get("pod") or None,
            "project_id": data.get("project") or None,
            "user_id": data.get("user") or None,
            "books": data.get("counter") or None,
            "page": data.get("page") or 1,
        }

    def active_filters(self) -> dict[str, str]:
        """The filters in use (for the empty state and for keeping them across pages)."""
        if not self.is_valid():
            return {}
        return {name: self.cleaned_data[name] for name in self.FILTERS if self.cleaned_data.get(name)}


class DefinitionForm(forms.Form):
    """Which lease and which project the merged definition is shown for."""

    name = forms.CharField(
        label="Lease", max_length=64, validators=[_engine_validator(validation.lease_name)],
        widget=forms.TextInput(attrs={"list": "lease-names", "autocomplete": "off", "placeholder": "e.g. tex"}),
    )
    # Optional: a link or URL with just ?name= shows the tenant-wide view (no project layer),
    # the one that needs no project to be chosen first.
    project = forms.ChoiceField(label="As seen from project", required=False)

    def __init__(self, *args: Any, projects: list[str], **kwargs: Any):
        super().__init__(*args, **kwargs)
        # Only the tenant's own projects (and the tenant-wide layer) can be chosen, so the
        # view never merges another tenant's project layer.
        choices = [(TENANT_PROJECT, "(tenant-wide: no project layer)")] + [(p, p) for p in projects]
        self.fields["project"].choices = choices

    def clean_project(self) -> str:
        """The chosen project, or the tenant-wide layer when none is given."""
        return self.cleaned_data.get("project") or TENANT_PROJECT


class RevokeForm(forms.Form):
    """The confirmation step of a revocation."""

    confirm = forms.BooleanField(
        label="Yes, revoke this lease now", required=True,
        error_messages={"required": "Tick the box to confirm the revocation."},
    )
    reason = forms.CharField(
        label="Reason (for the audit log)", required=False, max_length=200, strip=True,
        widget=forms.TextInput(attrs={"placeholder": "optional, e.g. stuck compile", "class": "wide"}),
    )

    def clean_reason(self) -> str:
        reason = self.cleaned_data.get("reason") or ""
        if "\x00" in reason:
            raise forms.ValidationError("The reason may not contain NUL characters.")
        return reason


class ProjectWeightForm(forms.Form):
    """A tenant admin's weight for one of the tenant's projects on one lease (blank: reset
    to the default 1)."""

    name = forms.CharField(label="Lease", max_length=64, validators=[_engine_validator(validation.lease_name)],
                           widget=forms.HiddenInput)
    project = forms.ChoiceField(label="Project")
    weight = forms.FloatField(
        label="Weight", required=False, min_value=0.001, max_value=1_000_000,
        error_messages={"min_value": "A weight is a positive number.", "max_value": "At most 1000000.",
                        "invalid": "A weight is a number, e.g. 2 or 0.5."},
        widget=forms.NumberInput(attrs={"step": "any", "placeholder": "1"}))

    def __init__(self, *args: Any, projects: list[str], **kwargs: Any):
        super().__init__(*args, **kwargs)
        # Only the tenant's own projects: a weight for another tenant's project id would
        # mean nothing, and the form never offers one.
        self.fields["project"].choices = [(p, p) for p in projects]
