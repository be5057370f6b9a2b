"""Form of the API-key page: parses and validates; :mod:`leases.api.keys` decides."""

from __future__ import annotations

from django import forms

from .keys import NAME_MAX


class CreateKeyForm(forms.Form):
    """Name and optional project of a new key; the project must be one of the tenant's."""

    name = forms.CharField(label="Name", max_length=NAME_MAX, strip=True,
                           widget=forms.TextInput(attrs={"placeholder": "e.g. mcp-server prod", "autocomplete": "off"}))
    project = forms.ChoiceField(label="Bound to project", required=False)

    def __init__(self, *args, projects: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        # Choices only: a typed project id never reaches a query unchecked.
        self.fields["project"].choices = [("", "— all projects of the tenant —")] + [(p, p) for p in projects]
