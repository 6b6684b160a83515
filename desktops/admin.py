"""The support staff's view. Lifecycle actions go through the same services as the API."""

from django.contrib import admin, messages

from desktops import services
from desktops.audit import Actor
from desktops.errors import DomainError
from desktops.models import ApiKey, AuditEvent, Desktop, DesktopEvent, LLMKey, Membership, Plan, Workspace


def _lifecycle_action(step: str):
    def run(modeladmin, request, queryset):
        actor = Actor(user=request.user, support=True)
        done = 0
        for desktop in queryset:
            try:
                services.desktop_act(actor=actor, desktop=desktop, action=step)
                done += 1
            except DomainError as exc:
                modeladmin.message_user(request, f"{desktop.name}: {exc.message}", messages.WARNING)
        modeladmin.message_user(request, f"{step.capitalize()} requested for {done} desktop(s).")

    run.short_description = f"{step.capitalize()} selected desktops"
    run.__name__ = f"desktop_{step}"
    return run


class DesktopEventInline(admin.TabularInline):
    model = DesktopEvent
    extra = 0
    can_delete = False
    readonly_fields = ["created_at", "from_state", "to_state", "actor", "reason"]
    fields = readonly_fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Desktop)
class DesktopAdmin(admin.ModelAdmin):
    list_display = ["name", "id", "workspace", "plan", "state", "private_ip", "driver", "created_at"]
    list_filter = ["state", "driver", "plan"]
    search_fields = ["id", "name", "workspace__name", "workspace__id", "private_ip"]
    readonly_fields = [f.name for f in Desktop._meta.fields]
    actions = [_lifecycle_action(step) for step in ("start", "stop", "destroy")]
    inlines = [DesktopEventInline]

    def has_add_permission(self, request):
        return False


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin):
    list_display = ["name", "id", "created_at"]
    search_fields = ["id", "name"]
    inlines = [MembershipInline]


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = ["name", "vcpus", "memory_mib", "disk_gib", "monthly_price", "is_active"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "prefix",
        "workspace",
        "scope",
        "created_by",
        "expires_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["scope"]
    search_fields = ["id", "name", "prefix", "workspace__id"]
    readonly_fields = ["id", "workspace", "prefix", "hashed", "created_by", "created_at", "last_used_at"]
    fields = [
        "id",
        "workspace",
        "name",
        "prefix",
        "hashed",
        "scope",
        "expires_at",
        "revoked_at",
        "created_by",
    ]


@admin.register(LLMKey)
class LLMKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "provider", "workspace", "last4", "updated_at"]
    search_fields = ["id", "name", "workspace__id"]
    # The encrypted secret is never shown, not even to support staff.
    fields = ["id", "workspace", "provider", "name", "base_url", "last4", "created_by", "created_at"]
    readonly_fields = fields


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["at", "actor", "action", "target", "workspace_id", "ip", "request_id"]
    list_filter = ["action"]
    search_fields = ["actor", "action", "target", "workspace_id", "request_id"]
    date_hierarchy = "at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
