"""leases.routers.LeasesRouter: the lease apps on their alias, the host's apps left alone."""

from __future__ import annotations

from django.apps import apps
from django.contrib.auth import get_user_model
from django.test import override_settings

from insights.models import Membership, Tenant
from leases.api.models import ApiKey
from leases.routers import LeasesRouter

router = LeasesRouter()


@override_settings(LEASES_DATABASE="leases")
def test_given_a_lease_alias_when_routing_then_every_lease_app_model_goes_there_and_host_models_are_not_answered():
    lease_models = [m for m in apps.get_models() if m._meta.app_label in {"leases", "leases_api", "insights"}]
    assert len(lease_models) >= 5
    assert {router.db_for_read(m) for m in lease_models} == {"leases"}
    assert {router.db_for_write(m) for m in lease_models} == {"leases"}
    assert router.db_for_read(get_user_model()) is None


@override_settings(LEASES_DATABASE="leases")
def test_given_a_lease_alias_when_migrating_then_lease_apps_go_only_there_and_host_apps_never_there():
    assert router.allow_migrate("leases", "leases") is True
    assert router.allow_migrate("default", "leases") is False
    assert router.allow_migrate("default", "insights") is False
    assert router.allow_migrate("leases", "leases_api") is True
    assert router.allow_migrate("leases", "auth") is False
    assert router.allow_migrate("default", "auth") is None  # the host's routers decide


@override_settings(LEASES_DATABASE="leases")
def test_given_a_membership_on_the_lease_alias_when_its_user_is_read_then_the_default_alias_answers():
    membership = Membership(tenant=Tenant(slug="t", name="T"), role=Membership.Role.ADMIN)
    assert router.db_for_read(get_user_model(), instance=membership) == "default"
    assert router.allow_relation(get_user_model()(username="u"), membership) is True
    assert router.allow_relation(get_user_model()(username="u"), get_user_model()(username="v")) is None


def test_given_the_default_setting_when_routing_then_everything_stays_on_default():
    assert router.db_for_write(ApiKey) == "default"
    assert router.allow_migrate("default", "leases") is True
    assert router.allow_migrate("default", "auth") is None
    assert router.db_for_read(get_user_model(), instance=Membership()) is None
