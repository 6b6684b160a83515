"""Usage and cost from the record, over a simulated clock: exact to the second and to the cent."""

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
import time_machine

from billing import services as billing
from billing.metering import GIB
from billing.models import CreditGrant, DiskMeter, ModelPrice, StorageDay
from billing.selectors import costs_of_desktop, month_costs
from desktops import lifecycle, services
from desktops.audit import Actor
from desktops.models import ChatMessage, DesktopState, LLMKey, Role
from tests.factories import DesktopFactory, SubscriptionFactory, TierFactory, history, round_prices
from workers import tasks

pytestmark = pytest.mark.django_db


def at(day: int, hour: int, minute: int = 0, month: int = 3) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=UTC)


@pytest.fixture
def priced(plan):
    return round_prices(plan)


@pytest.fixture
def owner(members):
    return Actor(user=members[Role.OWNER].user)


def test_a_day_of_a_desktop_across_stop_suspend_resume_and_killed_workers(workspace, owner, priced, driver):
    """The event log, not the workers, says what ran: steps a killed worker left half done cost nothing."""
    LLMKey.objects.create(
        workspace=workspace,
        provider="anthropic",
        name="k",
        model="claude-x",
        secret_encrypted="-",
        last4="0000",
    )
    ModelPrice.objects.create(
        workspace=workspace, model="claude-x", input_per_million=Decimal(3), output_per_million=Decimal(15)
    )
    with time_machine.travel(at(2, 9), tick=False) as clock:

        def step(when: datetime, action: str, *, worker_done: datetime | None = None):
            """An operator asks at `when`; the worker completes at `worker_done` (never, if None)."""
            clock.move_to(when)
            services.desktop_act(actor=owner, desktop=desktop, action=action)
            if worker_done is not None:
                clock.move_to(worker_done)
                assert lifecycle.desktop_run_step(desktop_id=desktop.id, action=action)

        def sample(when: datetime, used: int | None):
            clock.move_to(when)
            driver.set_disk_usage(desktop.id, used)
            billing.storage_sample()

        desktop = services.desktop_create(actor=owner, workspace=workspace, plan=priced.plan, name="agent")
        clock.move_to(at(2, 9, 10))
        assert lifecycle.desktop_run_step(desktop_id=desktop.id, action="provision")  # running 09:10
        sample(at(2, 10), 2 * GIB)
        step(at(2, 11, 10), "stop", worker_done=at(2, 11, 15))  # ran 2 h
        # Stopped, its disk unmounted: the engine cannot tell, the last measure holds.
        sample(at(2, 12), None)
        # The start's worker is killed: it is redelivered an hour later and only then does it run.
        step(at(2, 14, 15), "start")
        clock.move_to(at(2, 15, 15))
        assert lifecycle.desktop_run_step(desktop_id=desktop.id, action="start")
        sample(at(2, 16), 3 * GIB)
        step(at(2, 16, 45), "suspend", worker_done=at(2, 16, 46))  # ran 1.5 h
        step(at(2, 18, 46), "resume", worker_done=at(2, 19))  # suspended 2 h, resuming 14 min
        clock.move_to(at(2, 23))
        ChatMessage.objects.create(
            desktop=desktop,
            author=ChatMessage.Author.AGENT,
            completed_at=at(2, 23),
            input_tokens=1_000_000,
            output_tokens=200_000,
        )
        # The stop's worker dies and the step is given up on: the desktop ends in error, which never ran.
        step(at(3, 1), "stop")  # ran 6 h, across midnight
        clock.move_to(at(3, 2))
        lifecycle.desktop_step_failed(desktop_id=desktop.id, action="stop", message="worker lost")
        sample(at(3, 12), None)

        costs = month_costs(workspace=workspace, month=date(2026, 3, 1))

    desktop.refresh_from_db()
    assert desktop.state == DesktopState.ERROR
    meter = costs.meter
    assert (meter.running_hours, meter.suspended_hours, meter.stopped_hours) == (9.5, 2, 3)
    # 2 GiB from 10:00 to 16:00, then 3 GiB until the next day at noon.
    assert meter.gib_hours == 2 * 6 + 3 * 20
    assert (meter.compute, meter.storage, meter.models) == (Decimal("0.95"), Decimal("0.072"), Decimal(6))
    assert meter.total == Decimal("7.022")
    first, second = costs.days[1], costs.days[2]
    assert (first.day, first.meter.running_hours, first.meter.gib_hours) == (date(2026, 3, 2), 8.5, 36)
    assert (second.day, second.meter.running_hours, second.meter.gib_hours) == (date(2026, 3, 3), 1, 36)
    assert (first.running_peak, second.running_peak) == (1, 1)
    assert len(costs.days) == 3  # the month so far: 1 to 3 March
    assert sum(StorageDay.objects.values_list("gib_hours", flat=True)) == 72
    # Free tier: the platform's €1.022 are within its included €15, so nothing is owed.
    assert (costs.tier.name, costs.included, costs.owed) == ("free", Decimal("1.022"), 0)


def test_the_last_measure_holds_until_now_between_samples(workspace, owner, priced, driver):
    desktop = DesktopFactory(workspace=workspace, plan=priced.plan)
    history(desktop, (at(10, 8), DesktopState.RUNNING))
    driver.plant(desktop.id)
    with time_machine.travel(at(10, 8), tick=False) as clock:
        driver.set_disk_usage(desktop.id, GIB)
        billing.storage_sample()
        clock.move_to(at(10, 14))  # no sample since 08:00 (beat was down): the last measure still counts
        costs = costs_of_desktop(actor=owner, desktop_id=desktop.id, month=date(2026, 3, 1))
    assert (costs.meter.gib_hours, costs.meter.running_hours) == (6, 6)
    assert list(costs.days) == [date(2026, 3, 10)]


def test_a_destroyed_desktop_stops_counting_at_its_destruction(workspace, priced):
    desktop = DesktopFactory(workspace=workspace, plan=priced.plan)
    DiskMeter.objects.create(desktop=desktop, bytes=4 * GIB, measured_at=at(5, 0), counted_until=at(5, 0))
    history(
        desktop,
        (at(5, 0), DesktopState.RUNNING),
        (at(5, 10), DesktopState.DESTROYING),
        (at(5, 12), DesktopState.DESTROYED),
    )
    with time_machine.travel(at(9, 0), tick=False):
        assert billing.storage_sample() == 1
        assert billing.storage_sample() == 0  # closed: nothing more to count
        costs = month_costs(workspace=workspace, month=date(2026, 3, 1))
    assert (costs.meter.running_hours, costs.meter.gib_hours) == (10, 4 * 12)
    assert costs.desktops[0].desktop.id == desktop.id


def test_a_month_starts_from_the_state_the_log_left_it_in(workspace, priced):
    desktop = DesktopFactory(workspace=workspace, plan=priced.plan)
    history(desktop, (at(28, 22, month=2), DesktopState.RUNNING), (at(1, 2), DesktopState.STOPPED))
    with time_machine.travel(at(20, 0), tick=False):
        february = month_costs(workspace=workspace, month=date(2026, 2, 1))
        march = month_costs(workspace=workspace, month=date(2026, 3, 1))
    assert february.meter.running_hours == 2 and len(february.days) == 28
    assert march.meter.running_hours == 2 and march.meter.stopped_hours == 19 * 24 - 2


def test_running_peak_counts_desktops_running_together(workspace, priced):
    one, two, three = (DesktopFactory(workspace=workspace, plan=priced.plan) for _ in range(3))
    history(one, (at(4, 8), DesktopState.RUNNING), (at(4, 12), DesktopState.STOPPED))
    history(two, (at(4, 10), DesktopState.RUNNING), (at(4, 15), DesktopState.STOPPED))
    # Starts exactly when `one` stops: never ran with it.
    history(three, (at(4, 12), DesktopState.RUNNING), (at(4, 13), DesktopState.STOPPED))
    with time_machine.travel(at(5, 0), tick=False):
        costs = month_costs(workspace=workspace, month=date(2026, 3, 1))
    assert [d.running_peak for d in costs.days] == [0, 0, 0, 2]
    assert [d.desktop.id for d in costs.desktops][:1] == [two.id]


def test_credits_pay_the_fee_and_usage_oldest_month_first(workspace, priced):
    team = TierFactory(name="team-test", monthly_fee=Decimal(29))
    SubscriptionFactory(workspace=workspace, tier=team)
    desktop = DesktopFactory(workspace=workspace, plan=priced.plan)
    history(desktop, (at(1, 0, month=1), DesktopState.RUNNING), (at(1, 10, month=1), DesktopState.STOPPED))
    grant = CreditGrant.objects.create(workspace=workspace, amount=Decimal(50), reason="beta", granted_by="t")
    CreditGrant.objects.filter(id=grant.id).update(created_at=at(15, 0, month=1))
    with time_machine.travel(at(10, 0), tick=False):
        january = month_costs(workspace=workspace, month=date(2026, 1, 1))
        february = month_costs(workspace=workspace, month=date(2026, 2, 1))
        march = month_costs(workspace=workspace, month=date(2026, 3, 1))
    # January: €29 fee + 10 h at €0.10 = €30, all paid by the credit; €20 left for February's fee.
    assert (january.credits, january.owed) == (30, 0)
    assert (february.credits, february.owed) == (20, 9)
    assert (march.credits, march.owed) == (0, 29)


def test_beat_measures_the_disks_then_records_the_alerts(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["billing-meter"]
    assert entry["task"] == tasks.billing_meter.name == "workers.tasks.billing_meter"
    assert tasks.billing_meter() == {"disks": 0, "alerts": []}
