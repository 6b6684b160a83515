"""Support's side of billing: tiers, plan prices, each workspace's tier, credits, spend alerts.

Changing a workspace's tier and granting credits go through the services, audited as support.
"""

from django.contrib import admin

from billing import services
from billing.models import CreditGrant, PlanPrice, SpendAlert, Subscription, Tier
from desktops.audit import Actor


def _support(request) -> Actor:
    return Actor(user=request.user, support=True)


@admin.register(Tier)
class TierAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "monthly_fee",
        "included_usage",
        "max_desktops",
        "max_running",
        "max_disk_gib",
        "monthly_spend_cap",
        "is_public",
    ]


@admin.register(PlanPrice)
class PlanPriceAdmin(admin.ModelAdmin):
    list_display = ["plan", "hourly", "storage_gib_month"]


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin):
    list_display = ["workspace", "tier", "changed_at"]
    list_filter = ["tier"]
    search_fields = ["workspace__id", "workspace__name"]
    autocomplete_fields = ["workspace"]

    def get_readonly_fields(self, request, obj=None):
        return ["workspace"] if obj else []

    def save_model(self, request, obj, form, change):
        services.subscription_set(actor=_support(request), workspace_id=obj.workspace_id, tier=obj.tier)


@admin.register(CreditGrant)
class CreditGrantAdmin(admin.ModelAdmin):
    list_display = ["workspace", "amount", "reason", "granted_by", "created_at"]
    search_fields = ["workspace__id", "workspace__name", "reason"]
    autocomplete_fields = ["workspace"]
    fields = ["workspace", "amount", "reason"]

    def save_model(self, request, obj, form, change):
        grant = services.credit_grant(
            actor=_support(request), workspace_id=obj.workspace_id, amount=obj.amount, reason=obj.reason
        )
        # The admin goes on with `obj` (its log entry, the redirect): make it the grant just made.
        obj.pk, obj.granted_by, obj.created_at = grant.pk, grant.granted_by, grant.created_at

    # A grant is history: a mistaken one is offset by another, never edited away.
    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(SpendAlert)
class SpendAlertAdmin(admin.ModelAdmin):
    list_display = ["workspace", "month", "threshold", "spend", "cap", "created_at"]
    list_filter = ["threshold", "month"]
    search_fields = ["workspace__id", "workspace__name"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
