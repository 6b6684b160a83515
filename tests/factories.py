from decimal import Decimal

import factory
from django.contrib.auth import get_user_model

from billing.models import PlanPrice, Subscription, Tier
from desktops import crypto
from desktops.audit import Actor, audit_record
from desktops.models import (
    ApiKey,
    AuditEvent,
    Desktop,
    DesktopEvent,
    DesktopState,
    Membership,
    Plan,
    Role,
    Workspace,
)

# Every factory-made user's password, for the tests that log in through the pages.
PASSWORD = "correct horse battery staple"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    password = factory.django.Password(PASSWORD)

    @factory.post_generation
    def confirmed(user, create, confirmed, **kwargs):
        """Their address, confirmed unless `confirmed=False` (a free tier's desktops wait for that)."""
        if create and user.email:
            user.emailaddress_set.create(email=user.email, verified=confirmed is not False, primary=True)


class WorkspaceFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Workspace

    name = factory.Sequence(lambda n: f"Workspace {n}")


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    workspace = factory.SubFactory(WorkspaceFactory)
    user = factory.SubFactory(UserFactory)
    role = Role.MEMBER


class PlanFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Plan
        django_get_or_create = ("name",)

    name = "starter"
    vcpus = 1
    memory_mib = 2048
    disk_gib = 10
    monthly_price = "19.00"


class DesktopFactory(factory.django.DjangoModelFactory):
    """A desktop row already in a given state, without going through a worker."""

    class Meta:
        model = Desktop

    workspace = factory.SubFactory(WorkspaceFactory)
    plan = factory.SubFactory(PlanFactory)
    name = factory.Sequence(lambda n: f"desk-{n}")
    image_profile = "minimal"
    driver = "tests.support.directory_driver.DirectoryDriver"
    driver_ref = factory.LazyAttribute(lambda d: "ref")
    state = DesktopState.RUNNING


class TierFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tier
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"tier-{n}")
    max_desktops = 100
    max_running = 100
    max_disk_gib = 10_000
    monthly_spend_cap = None


class SubscriptionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Subscription

    workspace = factory.SubFactory(WorkspaceFactory)
    tier = factory.SubFactory(TierFactory)


def round_prices(plan: Plan) -> PlanPrice:
    """Prices easy to count with: €0.10 an hour running, €0.73 a GiB-month (€0.001 a GiB-hour)."""
    price, _ = PlanPrice.objects.update_or_create(
        plan=plan, defaults={"hourly": Decimal("0.10"), "storage_gib_month": Decimal("0.73")}
    )
    return price


def history(desktop: Desktop, *changes) -> None:
    """Write a desktop's event log as it happened: (when, new state) pairs, oldest first."""
    previous = ""
    for at, state in changes:
        event = desktop.events.create(from_state=previous, to_state=state, actor="test")
        DesktopEvent.objects.filter(id=event.id).update(created_at=at)
        previous = state
    (at, state) = changes[-1]
    Desktop.objects.filter(id=desktop.id).update(created_at=changes[0][0], state=state, state_changed_at=at)
    desktop.refresh_from_db()


def api_key_for(membership: Membership, scope: str = "write", **fields) -> str:
    """A real platform key of the member's, whatever their role (the API lets only admins make them)."""
    token, prefix = crypto.api_token_new()
    ApiKey.objects.create(
        workspace_id=membership.workspace_id,
        created_by=membership.user,
        name="test",
        scope=scope,
        prefix=prefix,
        hashed=crypto.api_token_hash(token),
        **fields,
    )
    return token


def audit_event(*, email: str, action: str, workspace_id: str, target: str = "") -> AuditEvent:
    """An audit event by the person of that address, written as the platform writes them: chained."""
    return audit_record(
        actor=Actor(user=UserFactory.build(email=email)),
        action=action,
        workspace_id=workspace_id,
        target=target,
    )
