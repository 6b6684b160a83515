"""What desktops cost and what a workspace may use: tiers and their quotas, prices, and the meters."""

from decimal import Decimal

from django.core.validators import MinValueValidator
from django.db import models
from django.utils.translation import gettext_lazy as _

from desktops.ids import PublicIdField
from desktops.models import Desktop, Plan, Workspace

MONEY = {"max_digits": 10, "decimal_places": 2}
RATE = {"max_digits": 10, "decimal_places": 4, "validators": [MinValueValidator(Decimal(0))]}


class Tier(models.Model):
    """What a workspace may use at once and spend in a month, and what it pays for the tier itself."""

    id = PublicIdField("tier")
    name = models.SlugField(max_length=40, unique=True)
    monthly_fee = models.DecimalField(**MONEY, default=Decimal(0), help_text=_("EUR per month"))
    included_usage = models.DecimalField(
        **MONEY,
        default=Decimal(0),
        help_text=_("EUR of desktop time and storage included each month"),
    )
    max_desktops = models.PositiveIntegerField(help_text=_("Desktops that exist at once"))
    max_running = models.PositiveIntegerField(help_text=_("Desktops running (or starting) at once"))
    max_disk_gib = models.PositiveIntegerField(help_text=_("Total disk of the plans of its desktops"))
    monthly_spend_cap = models.DecimalField(
        **MONEY,
        null=True,
        blank=True,
        help_text=_("EUR a month; once spent, no desktop starts until the next month. Blank: no cap."),
    )
    is_public = models.BooleanField(default=True, help_text=_("Shown on the pricing page"))

    class Meta:
        ordering = ["monthly_fee", "name"]

    def __str__(self):
        return self.name


class Subscription(models.Model):
    """The tier a workspace is on; a workspace without one is on the default tier (DEFAULT_TIER)."""

    workspace = models.OneToOneField(
        Workspace, primary_key=True, on_delete=models.CASCADE, related_name="subscription"
    )
    tier = models.ForeignKey(Tier, on_delete=models.PROTECT, related_name="subscriptions")
    changed_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return f"{self.workspace_id} on {self.tier}"


# Storage is priced by the GiB-month, and a month of billing has 730 hours (365 * 24 / 12).
HOURS_PER_MONTH = Decimal(730)


class PlanPrice(models.Model):
    """What a desktop of the plan costs: by the hour it runs, and by the GiB its disk holds."""

    plan = models.OneToOneField(Plan, primary_key=True, on_delete=models.CASCADE, related_name="price")
    hourly = models.DecimalField(**RATE, help_text=_("EUR per hour running"))
    storage_gib_month = models.DecimalField(
        **RATE, help_text=_("EUR per GiB of disk per month (730 hours), whatever the desktop's state")
    )

    def __str__(self):
        return f"{self.plan}: €{self.hourly}/h, €{self.storage_gib_month}/GiB-month"

    @property
    def always_on_month(self):
        """A month of running, for comparison with a monthly price."""
        return self.hourly * HOURS_PER_MONTH


class ModelPrice(models.Model):
    """A workspace's price for a model its agents use, to estimate what its own keys spend."""

    id = PublicIdField("mpr")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="model_prices")
    model = models.CharField(max_length=200)
    input_per_million = models.DecimalField(**RATE, help_text=_("EUR per million input tokens"))
    output_per_million = models.DecimalField(**RATE, help_text=_("EUR per million output tokens"))
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model"]
        constraints = [models.UniqueConstraint(fields=["workspace", "model"], name="one_price_per_model")]

    def __str__(self):
        return f"{self.model} in {self.workspace_id}"


class CreditGrant(models.Model):
    """Money support gave a workspace; it pays what the workspace owes, oldest grant first, until used."""

    id = PublicIdField("crd")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="credit_grants")
    amount = models.DecimalField(**MONEY, validators=[MinValueValidator(Decimal("0.01"))])
    reason = models.CharField(max_length=200)
    granted_by = models.CharField(max_length=200, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"€{self.amount} to {self.workspace_id}"


class DiskMeter(models.Model):
    """A desktop's last disk measure, and up to when it has been counted into StorageDay."""

    desktop = models.OneToOneField(
        Desktop, primary_key=True, on_delete=models.CASCADE, related_name="disk_meter"
    )
    bytes = models.PositiveBigIntegerField()
    measured_at = models.DateTimeField()
    counted_until = models.DateTimeField()

    def __str__(self):
        return f"{self.desktop_id}: {self.bytes} bytes at {self.measured_at:%Y-%m-%d %H:%M}"


class StorageDay(models.Model):
    """GiB-hours a desktop's disk held on one day: its measures, each held until the next."""

    desktop = models.ForeignKey(Desktop, on_delete=models.CASCADE, related_name="storage_days")
    day = models.DateField(db_index=True)
    gib_hours = models.DecimalField(max_digits=18, decimal_places=6, default=Decimal(0))

    class Meta:
        constraints = [models.UniqueConstraint(fields=["desktop", "day"], name="one_storage_row_a_day")]

    def __str__(self):
        return f"{self.desktop_id} on {self.day}: {self.gib_hours} GiB-hours"


class SpendAlert(models.Model):
    """A workspace's spend reached a share of its cap this month; recorded once per month and threshold."""

    id = PublicIdField("spa")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="spend_alerts")
    month = models.DateField(help_text=_("First day of the month"))
    threshold = models.PositiveSmallIntegerField(help_text=_("Percent of the cap"))
    spend = models.DecimalField(**MONEY)
    cap = models.DecimalField(**MONEY)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["month", "threshold"]
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "month", "threshold"], name="one_alert_per_threshold_a_month"
            )
        ]

    def __str__(self):
        return f"{self.workspace_id}: {self.threshold} % of the cap in {self.month:%Y-%m}"
