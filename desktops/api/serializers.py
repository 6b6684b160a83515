"""Shapes of the API's JSON (snake_case here, camelCase on the wire); no logic beyond input checks."""

import base64

from django.urls import reverse
from django.utils.translation import gettext as _
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from billing.metering import month_parse
from billing.models import ModelPrice, Tier
from billing.selectors import price_of
from desktops import screen
from desktops.agent_failures import agent_failure
from desktops.alerts import THRESHOLDS, alert_message, thresholds_of
from desktops.approvals import approval_has_screenshot, approval_status
from desktops.models import (
    Alert,
    ApiKey,
    ApiScope,
    Approval,
    AuditEvent,
    BlockedAttempt,
    ChatMessage,
    Desktop,
    DesktopEvent,
    DesktopState,
    EgressMode,
    Invitation,
    LLMKey,
    LLMProvider,
    Membership,
    Plan,
    Role,
    Schedule,
    ScheduleRun,
    WebhookDelivery,
    Workspace,
    hostname_validator,
)
from desktops.selectors import chat_content


class PlanSerializer(serializers.ModelSerializer):
    hourly_price = serializers.SerializerMethodField(help_text="EUR per hour running")
    storage_price = serializers.SerializerMethodField(help_text="EUR per GiB of disk per month")

    class Meta:
        model = Plan
        fields = [
            "id",
            "name",
            "vcpus",
            "memory_mib",
            "disk_gib",
            "monthly_price",
            "hourly_price",
            "storage_price",
        ]

    @extend_schema_field(serializers.DecimalField(max_digits=10, decimal_places=4))
    def get_hourly_price(self, plan) -> str:
        return str(price_of(plan).hourly)

    @extend_schema_field(serializers.DecimalField(max_digits=10, decimal_places=4))
    def get_storage_price(self, plan) -> str:
        return str(price_of(plan).storage_gib_month)


class DesktopSerializer(serializers.ModelSerializer):
    workspace_id = serializers.CharField(read_only=True)
    plan = PlanSerializer(read_only=True)
    labels = serializers.SlugRelatedField(many=True, read_only=True, slug_field="name")

    class Meta:
        model = Desktop
        fields = [
            "id",
            "name",
            "workspace_id",
            "plan",
            "state",
            "private_ip",
            "image_profile",
            "image",
            "driver",
            "driver_ref",
            "last_error",
            "progress",
            "labels",
            "created_at",
            "updated_at",
            "state_changed_at",
        ]


def _labels(**kwargs):
    label = serializers.CharField(max_length=63, help_text="e.g. ci, team-a, env=prod")
    return serializers.ListField(child=label, max_length=20, required=False, **kwargs)


class DesktopCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63, validators=[hostname_validator])
    workspace_id = serializers.CharField(required=False, help_text="Defaults to the key's workspace.")
    plan = serializers.CharField(required=False, help_text="Plan id or name; defaults to the default plan.")
    image_profile = serializers.ChoiceField(choices=["minimal", "full"], required=False)
    labels = _labels()


class BulkCreateSerializer(serializers.Serializer):
    """Many desktops of one plan and image: named in `names`, or `namePrefix` numbered `count` times."""

    workspace_id = serializers.CharField(required=False, help_text="Defaults to the key's workspace.")
    names = serializers.ListField(
        child=serializers.CharField(max_length=63, validators=[hostname_validator]),
        min_length=1,
        max_length=50,
        required=False,
    )
    name_prefix = serializers.CharField(
        max_length=50,
        validators=[hostname_validator],
        required=False,
        help_text="Names prefix-N, numbered on from the highest the workspace uses.",
    )
    count = serializers.IntegerField(min_value=1, max_value=50, required=False)
    plan = serializers.CharField(required=False, help_text="Plan id or name; defaults to the default plan.")
    image_profile = serializers.ChoiceField(choices=["minimal", "full"], required=False)
    labels = _labels()

    def validate(self, data):
        if ("names" in data) == ("name_prefix" in data) or ("name_prefix" in data) != ("count" in data):
            raise serializers.ValidationError(_("Give either names, or namePrefix with count."))
        return data


class BulkSelectionSerializer(serializers.Serializer):
    """Which of the workspace's desktops: by ids, labels (all of them) or state, or all of them."""

    workspace_id = serializers.CharField(required=False, help_text="Defaults to the key's workspace.")
    ids = serializers.ListField(child=serializers.CharField(max_length=40), max_length=500, required=False)
    labels = _labels(help_text="Desktops with every one of these labels.")
    state = serializers.ChoiceField(choices=DesktopState.choices, required=False)
    all = serializers.BooleanField(
        default=False, help_text="Every desktop of the workspace, when nothing else says."
    )


class BulkLabelsSerializer(BulkSelectionSerializer):
    add = _labels()
    remove = _labels()


class LabelsChangeSerializer(serializers.Serializer):
    add = _labels()
    remove = _labels()


class BulkOutcomeSerializer(serializers.Serializer):
    desktop_id = serializers.CharField()
    ok = serializers.BooleanField()
    name = serializers.CharField()
    state = serializers.CharField()
    code = serializers.CharField(help_text="Why not, for a program (as an error's code); blank when ok.")
    message = serializers.CharField(help_text="Why not, for a person; blank when ok.")


class BulkResultSerializer(serializers.Serializer):
    done = serializers.IntegerField()
    refused = serializers.IntegerField()
    results = BulkOutcomeSerializer(many=True)


class BulkCreatedSerializer(serializers.Serializer):
    desktops = DesktopSerializer(many=True)


class LabelCountSerializer(serializers.Serializer):
    name = serializers.CharField()
    desktops = serializers.IntegerField(help_text="Live desktops with this label.")


class ExecSerializer(serializers.Serializer):
    command = serializers.CharField(
        required=False, trim_whitespace=False, help_text="A command line for the agent user's shell."
    )
    argv = serializers.ListField(
        child=serializers.CharField(trim_whitespace=False, allow_blank=True),
        min_length=1,
        required=False,
        help_text="Or a program and its arguments, each passed as it is.",
    )
    timeout = serializers.IntegerField(min_value=1, max_value=600, default=60, help_text="Seconds.")
    stdin = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False, default="")

    def validate(self, data):
        if ("command" in data) == ("argv" in data):
            raise serializers.ValidationError(_("Give either command or argv."))
        return data


class ExecResultSerializer(serializers.Serializer):
    exit_code = serializers.IntegerField(allow_null=True, help_text="null: the connection broke first.")
    stdout = serializers.CharField()
    stderr = serializers.CharField()
    stdout_truncated = serializers.BooleanField(help_text="Only the first MiB is kept.")
    stderr_truncated = serializers.BooleanField()
    timed_out = serializers.BooleanField()
    duration_ms = serializers.IntegerField()


class ScheduleRunSerializer(serializers.ModelSerializer):
    reply_id = serializers.CharField(allow_null=True, read_only=True, help_text="The agent's answer.")

    class Meta:
        model = ScheduleRun
        fields = ["id", "due_at", "status", "reply_id", "error", "created_at", "updated_at"]


class ScheduleSerializer(serializers.ModelSerializer):
    desktop_id = serializers.CharField(read_only=True)
    created_by = serializers.EmailField(
        source="created_by.email", read_only=True, default=None, help_text="Whom it sends messages as."
    )
    last_run = serializers.SerializerMethodField()

    class Meta:
        model = Schedule
        fields = [
            "id",
            "desktop_id",
            "cron",
            "timezone",
            "message",
            "stop_after",
            "enabled",
            "next_run_at",
            "created_by",
            "created_at",
            "updated_at",
            "last_run",
        ]

    @extend_schema_field(ScheduleRunSerializer(allow_null=True))
    def get_last_run(self, schedule) -> dict | None:
        run = self.context.get("last_runs", {}).get(schedule.id)
        return ScheduleRunSerializer(run).data if run else None


class ScheduleWriteSerializer(serializers.Serializer):
    cron = serializers.CharField(max_length=100, help_text="minute hour day month weekday, e.g. 0 9 * * 1-5")
    message = serializers.CharField(help_text="Sent to the desktop's agent at each run.")
    timezone = serializers.CharField(max_length=64, default="UTC", help_text="e.g. Europe/Paris")
    stop_after = serializers.BooleanField(
        default=False, help_text="Stop the desktop once the agent has answered."
    )
    enabled = serializers.BooleanField(default=True)


class ScheduleUpdateSerializer(ScheduleWriteSerializer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for field in self.fields.values():  # a change names only what changes
            field.required, field.default = False, serializers.empty


class DesktopEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = DesktopEvent
        fields = ["id", "from_state", "to_state", "actor", "reason", "created_at"]


# When the workspace's alerts fire, one field per threshold (desktops.alerts.THRESHOLDS), each with a default.
AlertThresholdsSerializer = type(
    "AlertThresholdsSerializer",
    (serializers.Serializer,),
    {
        name: serializers.IntegerField(
            min_value=t.low, max_value=t.high, required=False, help_text=f"{t.label} ({t.default})"
        )
        for name, t in THRESHOLDS.items()
    },
)


class WorkspaceSerializer(serializers.ModelSerializer):
    alert_thresholds = serializers.SerializerMethodField()

    @extend_schema_field(AlertThresholdsSerializer)
    def get_alert_thresholds(self, workspace) -> dict:
        return thresholds_of(workspace)

    class Meta:
        model = Workspace
        fields = [
            "id",
            "name",
            "agent_command",
            "control_role",
            "approval_role",
            "approval_timeout",
            "alert_thresholds",
            "approval_commands",
            "created_at",
        ]
        read_only_fields = [
            "agent_command",
            "control_role",
            "approval_role",
            "approval_timeout",
            "approval_commands",
        ]


class WorkspaceUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False)
    agent_command = serializers.CharField(
        max_length=500,
        required=False,
        allow_blank=True,
        help_text="Run in a desktop per chat message; {session} and {message} are filled in. Blank: default.",
    )
    control_role = serializers.ChoiceField(
        choices=[Role.MEMBER, Role.ADMIN, Role.OWNER],
        required=False,
        help_text="The lowest role that may take control of a desktop (and so read what it holds: keys).",
    )
    approval_role = serializers.ChoiceField(
        choices=[Role.MEMBER, Role.ADMIN, Role.OWNER],
        required=False,
        help_text="The lowest role that may answer the agents' requests for approval.",
    )
    approval_timeout = serializers.IntegerField(
        required=False, help_text="Seconds a request for approval waits, by default, before it is refused."
    )
    alert_thresholds = AlertThresholdsSerializer(
        required=False, help_text="Thresholds to change; those left out keep their value."
    )
    approval_commands = serializers.ListField(
        child=serializers.CharField(allow_blank=True),
        required=False,
        help_text=(
            "Commands the agent (OpenClaw) runs only once approved, as words: `git push` asks before "
            "`cd repo && git push origin main`. Empty: it asks for none."
        ),
    )


class EgressWriteSerializer(serializers.Serializer):
    mode = serializers.ChoiceField(
        choices=EgressMode.choices,
        help_text="open: anywhere; allowlist: only the entries (and the LLM keys' hosts); deny: nowhere.",
    )
    entries = serializers.ListField(
        child=serializers.CharField(max_length=253),
        required=False,
        default=list,
        max_length=200,
        help_text="Domains (a domain covers its subdomains; *.example.com only its subdomains) and IPv4 "
        "networks (203.0.113.0/24), for the allow-list.",
    )
    allow_llm_providers = serializers.BooleanField(
        required=False, default=True, help_text="Allow-list: also the API hosts of the workspace's LLM keys."
    )


class EgressSerializer(EgressWriteSerializer):
    llm_hosts = serializers.ListField(
        child=serializers.CharField(), read_only=True, help_text="The API hosts of the workspace's LLM keys."
    )
    inherited = serializers.BooleanField(
        read_only=True, help_text="A desktop's: it follows its workspace's policy, having none of its own."
    )
    updated_at = serializers.DateTimeField(read_only=True, allow_null=True)
    updated_by = serializers.CharField(read_only=True)


class AgentUsageSerializer(serializers.Serializer):
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    requests = serializers.IntegerField(help_text="Model requests the agent made.")
    turns = serializers.IntegerField(help_text="Answered messages.")


class DesktopUsageSerializer(AgentUsageSerializer):
    desktop_id = serializers.CharField()
    name = serializers.CharField()


class WorkspaceUsageSerializer(serializers.Serializer):
    total = AgentUsageSerializer()
    desktops = DesktopUsageSerializer(many=True)


class MembershipSerializer(serializers.ModelSerializer):
    email = serializers.EmailField(source="user.email", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "email", "role", "created_at"]


class InvitationCreateSerializer(serializers.Serializer):
    email = serializers.EmailField()
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)


class InvitationSerializer(serializers.ModelSerializer):
    workspace_id = serializers.CharField(read_only=True)
    workspace_name = serializers.CharField(source="workspace.name", read_only=True)
    invited_by = serializers.EmailField(source="invited_by.email", read_only=True, default=None)

    class Meta:
        model = Invitation
        fields = ["id", "workspace_id", "workspace_name", "email", "role", "invited_by", "created_at"]


class MembershipUpdateSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


class ApiKeySerializer(serializers.ModelSerializer):
    workspace_id = serializers.CharField(read_only=True)
    created_by = serializers.EmailField(source="created_by.email", read_only=True)

    class Meta:
        model = ApiKey
        fields = [
            "id",
            "workspace_id",
            "name",
            "prefix",
            "scope",
            "expires_at",
            "last_used_at",
            "created_by",
            "created_at",
        ]


class ApiKeyCreateSerializer(serializers.Serializer):
    workspace_id = serializers.CharField(required=False)
    name = serializers.CharField(max_length=100)
    scope = serializers.ChoiceField(choices=ApiScope.choices, default=ApiScope.WRITE)
    expires_at = serializers.DateTimeField(required=False, allow_null=True)


class ApiKeyCreatedSerializer(ApiKeySerializer):
    key = serializers.CharField(read_only=True, help_text="Shown once: store it now.")

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "key"]


class LLMKeySerializer(serializers.ModelSerializer):
    workspace_id = serializers.CharField(read_only=True)

    class Meta:
        model = LLMKey
        fields = [
            "id",
            "workspace_id",
            "provider",
            "name",
            "base_url",
            "model",
            "last4",
            "created_at",
            "updated_at",
            "verdict",
            "check_detail",
            "checked_at",
        ]
        extra_kwargs = {
            "verdict": {"help_text": "The provider's answer to the key, asked from a running desktop"}
        }


class LLMKeyWriteSerializer(serializers.Serializer):
    workspace_id = serializers.CharField(required=False)
    provider = serializers.ChoiceField(choices=LLMProvider.choices)
    name = serializers.CharField(max_length=100)
    base_url = serializers.URLField(required=False, allow_blank=True, default="")
    model = serializers.CharField(
        max_length=200,
        required=False,
        allow_blank=True,
        default="",
        help_text="Blank: the provider's default.",
    )
    secret = serializers.CharField(
        write_only=True, trim_whitespace=True, min_length=8, style={"input_type": "password"}
    )


class AuditEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = ["id", "at", "actor", "workspace_id", "action", "target", "ip", "request_id", "detail"]


class RelaySessionRequestSerializer(serializers.Serializer):
    mode = serializers.ChoiceField(choices=["view", "control"], default="view")


class RelaySessionSerializer(serializers.Serializer):
    mode = serializers.CharField()
    expires_at = serializers.DateTimeField(help_text="Open the relays before this; they then stay open.")
    vnc_url = serializers.SerializerMethodField()
    vnc_ticket = serializers.CharField(
        source="vnc",
        help_text="Opens the screen relay once: send it as the WebSocket subprotocol lebureau.ticket.<it>.",
    )
    terminal_url = serializers.SerializerMethodField()
    terminal_ticket = serializers.CharField(
        source="terminal", help_text="Opens the terminal relay once, the same way."
    )

    def get_vnc_url(self, tickets) -> str:
        return f"/ws/desktops/{self.context['desktop_id']}/vnc"

    def get_terminal_url(self, tickets) -> str:
        return f"/ws/desktops/{self.context['desktop_id']}/terminal"


class ChatSendSerializer(serializers.Serializer):
    message = serializers.CharField(trim_whitespace=True)


class AgentFailureSerializer(serializers.Serializer):
    kind = serializers.CharField(help_text="llm_key_missing, llm_key_rejected, provider_unreachable, …")
    message = serializers.CharField(help_text="What happened, in words, in the reader's language")
    fix_url = serializers.CharField(help_text="The page where it is put right; empty when none is")
    detail = serializers.CharField(
        help_text="The provider's or the agent runtime's own words, where they say more; else empty"
    )


class ChatMessageSerializer(serializers.ModelSerializer):
    reply_to = serializers.CharField(source="reply_to_id", read_only=True)
    content = serializers.SerializerMethodField(help_text="So far, while the agent is still answering.")
    failure = serializers.SerializerMethodField(help_text="Why the turn failed (status error), else null.")

    def get_content(self, message) -> str:
        return chat_content(message)

    @extend_schema_field(AgentFailureSerializer(allow_null=True))
    def get_failure(self, message) -> dict | None:
        failure = agent_failure(message)
        if failure is None:
            return None
        fix_url = reverse("settings", args=[message.desktop.workspace_id]) if failure.fix else ""
        return {
            "kind": failure.kind,
            "message": failure.message,
            "fix_url": fix_url,
            "detail": failure.detail,
        }

    class Meta:
        model = ChatMessage
        fields = [
            "id",
            "author",
            "content",
            "status",
            "reply_to",
            "created_at",
            "completed_at",
            "input_tokens",
            "output_tokens",
            "model_requests",
            "failure",
        ]


# Costs and quotas


def _money(**kwargs):
    return serializers.DecimalField(max_digits=None, decimal_places=2, **kwargs)


def _quantity(**kwargs):
    return serializers.DecimalField(max_digits=None, decimal_places=4, **kwargs)


class TierSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tier
        fields = [
            "name",
            "monthly_fee",
            "included_usage",
            "max_desktops",
            "max_running",
            "max_disk_gib",
            "monthly_spend_cap",
        ]


class UsageSerializer(serializers.Serializer):
    running_hours = _quantity()
    suspended_hours = _quantity()
    stopped_hours = _quantity()
    gib_hours = _quantity(help_text="GiB of disk held, times the hours it held them")
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()


class CostSerializer(serializers.Serializer):
    compute = _money(help_text="Hours running at the plan's hourly price")
    storage = _money(help_text="GiB-hours at the plan's storage price")
    models = _money(help_text="Tokens at the workspace's price for its agents' model (paid to its provider)")
    total = _money()


class DayCostsSerializer(serializers.Serializer):
    day = serializers.DateField()
    running_desktops = serializers.IntegerField(source="running_peak", help_text="Most running at once")
    usage = UsageSerializer(source="meter")
    cost = CostSerializer(source="meter")


class DesktopDayCostsSerializer(serializers.Serializer):
    day = serializers.DateField()
    usage = UsageSerializer(source="meter")
    cost = CostSerializer(source="meter")


class DesktopCostsSerializer(serializers.Serializer):
    desktop_id = serializers.CharField(source="desktop.id")
    name = serializers.CharField(source="desktop.name")
    state = serializers.CharField(source="desktop.state")
    plan = serializers.CharField(source="desktop.plan.name")
    usage = UsageSerializer(source="meter")
    cost = CostSerializer(source="meter")


class DesktopMonthCostsSerializer(DesktopCostsSerializer):
    days = serializers.SerializerMethodField()

    @extend_schema_field(DesktopDayCostsSerializer(many=True))
    def get_days(self, costs) -> list[dict]:
        days = [{"day": day, "meter": meter} for day, meter in costs.days.items()]
        return DesktopDayCostsSerializer(days, many=True).data


class SpendAlertSerializer(serializers.Serializer):
    threshold = serializers.IntegerField(help_text="Percent of the cap")
    spend = _money()
    cap = _money()
    created_at = serializers.DateTimeField()


class MonthCostsSerializer(serializers.Serializer):
    workspace_id = serializers.CharField(source="workspace.id")
    month = serializers.DateField(format="%Y-%m")
    currency = serializers.SerializerMethodField()
    tier = TierSerializer()
    usage = UsageSerializer(source="meter")
    cost = CostSerializer(source="meter")
    fee = _money(source="tier.monthly_fee", help_text="The tier's own monthly price")
    included = _money(help_text="Desktop time and storage the tier includes")
    credits = _money(help_text="Credits paying part of this month")
    owed = _money(help_text="Fee, plus desktop time and storage beyond what is included, less credits")
    spend_cap = _money(source="tier.monthly_spend_cap", allow_null=True)
    cap_used_percent = serializers.IntegerField(source="cap_used", allow_null=True)
    agent_model = serializers.CharField(source="model", help_text="The model the tokens are priced at")
    model_priced = serializers.SerializerMethodField()
    days = DayCostsSerializer(many=True)
    desktops = DesktopCostsSerializer(many=True, help_text="The biggest spender first")
    alerts = SpendAlertSerializer(many=True)

    def get_currency(self, costs) -> str:
        return "EUR"

    def get_model_priced(self, costs) -> bool:
        return costs.model_price is not None


class FilePathQuery(serializers.Serializer):
    path = serializers.CharField(
        max_length=4096, help_text="In the agent's home: relative to it, or absolute inside it"
    )


class FileWrittenSerializer(serializers.Serializer):
    path = serializers.CharField(help_text="Where the file was written, absolute")


class CostsQuery(serializers.Serializer):
    month = serializers.CharField(required=False, help_text="YYYY-MM; this month when not given")

    def validate_month(self, value: str):
        try:
            return month_parse(value)
        except ValueError as exc:
            raise serializers.ValidationError(_("Give the month as YYYY-MM, e.g. 2026-12.")) from exc


class QuotaSerializer(serializers.Serializer):
    used = serializers.IntegerField()
    limit = serializers.IntegerField()
    percent = serializers.IntegerField(allow_null=True)


class SpendQuotaSerializer(serializers.Serializer):
    used = _money()
    limit = _money(allow_null=True, help_text="null: no cap")
    percent = serializers.IntegerField(allow_null=True)


class QuotaUsageSerializer(serializers.Serializer):
    tier = TierSerializer()
    desktops = QuotaSerializer()
    running = QuotaSerializer(help_text="Desktops running or on their way to it")
    disk_gib = QuotaSerializer(help_text="GiB of disk of the live desktops' plans")
    spend = SpendQuotaSerializer(help_text="EUR spent this month, models included")


class ModelPriceSerializer(serializers.ModelSerializer):
    class Meta:
        model = ModelPrice
        fields = ["id", "model", "input_per_million", "output_per_million", "updated_at"]


class ModelPriceWriteSerializer(serializers.Serializer):
    model = serializers.CharField(max_length=200, help_text="As the agent names it, e.g. claude-sonnet-4-5")
    input_per_million = serializers.DecimalField(max_digits=10, decimal_places=4, min_value=0)
    output_per_million = serializers.DecimalField(max_digits=10, decimal_places=4, min_value=0)


# Approvals


class ApprovalSerializer(serializers.ModelSerializer):
    desktop_name = serializers.CharField(source="desktop.name", read_only=True)
    workspace_id = serializers.CharField(source="desktop.workspace_id", read_only=True)
    status = serializers.SerializerMethodField(help_text="pending, approved, denied or expired (timed out).")
    decided_by = serializers.SerializerMethodField()
    turn = serializers.CharField(
        source="turn_id",
        read_only=True,
        allow_null=True,
        help_text="The agent's reply under way when it asked.",
    )
    has_screenshot = serializers.SerializerMethodField(
        help_text="The desktop's screen was kept as it asked: GET /api/approvals/{id}/screenshot."
    )

    def get_has_screenshot(self, approval) -> bool:
        return approval_has_screenshot(approval)

    def get_status(self, approval) -> str:
        return approval_status(approval)

    def get_decided_by(self, approval) -> str:
        return approval.decided_by.email if approval.decided_by else ""

    class Meta:
        model = Approval
        fields = [
            "id",
            "desktop",
            "desktop_name",
            "workspace_id",
            "title",
            "details",
            "cwd",
            "turn",
            "digest",
            "status",
            "requested_at",
            "expires_at",
            "decided_by",
            "decided_at",
            "comment",
            "has_screenshot",
        ]


class ApprovalQuery(serializers.Serializer):
    workspace = serializers.CharField(required=False, help_text="Workspace id (ws_…)")
    desktop = serializers.CharField(required=False, help_text="Desktop id (dsk_…)")
    status = serializers.ChoiceField(choices=Approval.Status.values, required=False)


class ApprovalDecisionSerializer(serializers.Serializer):
    comment = serializers.CharField(required=False, default="", allow_blank=True, max_length=2000)


# Alerts


class AlertSerializer(serializers.ModelSerializer):
    desktop_name = serializers.CharField(source="desktop.name", read_only=True)
    message = serializers.SerializerMethodField(help_text="What happened, in words.")
    acknowledged_by = serializers.SerializerMethodField()

    def get_message(self, alert) -> str:
        return alert_message(alert)

    def get_acknowledged_by(self, alert) -> str:
        return alert.acknowledged_by.email if alert.acknowledged_by else ""

    class Meta:
        model = Alert
        fields = [
            "id",
            "workspace",
            "desktop",
            "desktop_name",
            "kind",
            "status",
            "message",
            "detail",
            "raised_at",
            "acknowledged_by",
            "acknowledged_at",
            "resolution",
            "resolved_at",
        ]


class AlertQuery(serializers.Serializer):
    workspace = serializers.CharField(required=False, help_text="Workspace id (ws_…)")
    desktop = serializers.CharField(required=False, help_text="Desktop id (dsk_…)")
    status = serializers.ChoiceField(choices=Alert.Status.values, required=False)
    kind = serializers.ChoiceField(choices=Alert.Kind.values, required=False)


class BlockedAttemptSerializer(serializers.ModelSerializer):
    via = serializers.ChoiceField(
        choices=BlockedAttempt.Via.values,
        help_text="name: look-ups its resolver refused; address: packets dropped on their way there.",
    )

    class Meta:
        model = BlockedAttempt
        fields = ["via", "destination", "attempts", "first_at", "last_at"]


# Webhooks


class WebhookSetSerializer(serializers.Serializer):
    url = serializers.CharField(allow_blank=True, max_length=500, help_text="http(s) address; blank: none.")
    rotate_secret = serializers.BooleanField(default=False, help_text="Make a new signing secret.")


class WebhookSerializer(serializers.Serializer):
    url = serializers.CharField()
    secret = serializers.CharField(
        help_text="The signing secret, only in the answer that made it; keep it, it is not shown again."
    )


class WebhookDeliverySerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "event",
            "url",
            "payload",
            "status",
            "attempts",
            "response_status",
            "last_error",
            "created_at",
            "delivered_at",
        ]


# The screen (desktops.screen)


class ScreenshotQuery(serializers.Serializer):
    format = serializers.ChoiceField(choices=sorted(screen.FORMATS), default="png")
    width = serializers.IntegerField(
        min_value=16,
        max_value=8192,
        required=False,
        help_text="Scale the image down to this width (never up); X-Screenshot-Scale says by how much.",
    )


class ScreenPointSerializer(serializers.Serializer):
    x = serializers.IntegerField()
    y = serializers.IntegerField()


class ScreenSerializer(serializers.Serializer):
    width = serializers.IntegerField()
    height = serializers.IntegerField()
    name = serializers.CharField()
    cursor = ScreenPointSerializer(
        allow_null=True, help_text="Where the pointer is, when the desktop's screen says (null: not known)."
    )

    def to_representation(self, info):
        cursor = {"x": info.cursor[0], "y": info.cursor[1]} if info.cursor else None
        return {"width": info.width, "height": info.height, "name": info.name, "cursor": cursor}


# What each kind of action takes: required, then optional, fields.
ACTION_FIELDS = {
    "move": (("x", "y"), ()),
    "click": (("x", "y"), ("button", "double")),
    "drag": (("x", "y", "to_x", "to_y"), ("button",)),
    "scroll": (("x", "y"), ("dx", "dy")),
    "type": (("text",), ()),
    "key": (("keys",), ()),
    "wait": (("ms",), ()),
}


class ScreenActionSerializer(serializers.Serializer):
    type = serializers.ChoiceField(choices=list(ACTION_FIELDS))
    x = serializers.IntegerField(min_value=0, required=False, help_text="Screen pixels from the left.")
    y = serializers.IntegerField(min_value=0, required=False, help_text="Screen pixels from the top.")
    to_x = serializers.IntegerField(min_value=0, required=False, help_text="Where a drag ends.")
    to_y = serializers.IntegerField(min_value=0, required=False)
    button = serializers.ChoiceField(choices=list(screen.BUTTONS), required=False)
    double = serializers.BooleanField(required=False, help_text="A double click.")
    dx = serializers.IntegerField(
        min_value=-screen.MAX_SCROLL,
        max_value=screen.MAX_SCROLL,
        required=False,
        help_text="Wheel clicks right.",
    )
    dy = serializers.IntegerField(
        min_value=-screen.MAX_SCROLL,
        max_value=screen.MAX_SCROLL,
        required=False,
        help_text="Wheel clicks down.",
    )
    text = serializers.CharField(
        max_length=screen.MAX_TEXT, trim_whitespace=False, required=False, help_text="Any Unicode text."
    )
    keys = serializers.CharField(
        max_length=100, required=False, help_text="A combination: ctrl+l, alt+F4, enter."
    )
    ms = serializers.IntegerField(
        min_value=0, max_value=screen.MAX_WAIT_MS, required=False, help_text="A wait."
    )

    def to_internal_value(self, data):
        if isinstance(data, dict):
            kind = data.get("type")
            if isinstance(kind, str) and kind in ACTION_FIELDS:
                required, optional = ACTION_FIELDS[kind]
                unknown = sorted(set(data) - {"type", *required, *optional})
                missing = [name for name in required if data.get(name) is None]
                if unknown:
                    raise serializers.ValidationError(
                        _("A %(type)s action takes no %(fields)s.")
                        % {"type": kind, "fields": ", ".join(unknown)}
                    )
                if missing:
                    raise serializers.ValidationError(
                        _("A %(type)s action needs %(fields)s.")
                        % {"type": kind, "fields": ", ".join(missing)}
                    )
            wrong = [name for name in ("text", "keys") if name in data and not isinstance(data[name], str)]
            if wrong:
                raise serializers.ValidationError({wrong[0]: [_("Not a valid string.")]})
        return super().to_internal_value(data)

    def validate(self, data):
        if data["type"] == "scroll" and not (data.get("dx") or data.get("dy")):
            raise serializers.ValidationError(_("A scroll action needs dx or dy."))
        if data["type"] == "type" and not data["text"]:
            raise serializers.ValidationError(_("A type action needs text to type."))
        return screen.Action(**data)


class ScreenActionsSerializer(serializers.Serializer):
    actions = serializers.ListField(
        child=ScreenActionSerializer(),
        min_length=1,
        max_length=screen.MAX_ACTIONS,
        help_text="Done in order.",
    )
    screenshot = serializers.BooleanField(
        default=False, help_text="Answer with a screenshot taken once the screen has settled."
    )
    format = serializers.ChoiceField(choices=sorted(screen.FORMATS), default="png")
    width = serializers.IntegerField(min_value=16, max_value=8192, required=False)


class ScreenshotSerializer(serializers.Serializer):
    content_type = serializers.CharField()
    data = serializers.SerializerMethodField(help_text="The image, base64-encoded.")
    width = serializers.IntegerField()
    height = serializers.IntegerField()
    scale = serializers.FloatField(help_text="Image pixels per screen pixel.")
    screen_width = serializers.IntegerField()
    screen_height = serializers.IntegerField()

    def get_data(self, shot) -> str:
        return base64.b64encode(shot.data).decode()


class ScreenActionsDoneSerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="Actions done.")
    screenshot = ScreenshotSerializer(allow_null=True)
