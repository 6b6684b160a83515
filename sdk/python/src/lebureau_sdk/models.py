"""What the API answers, as typed Python objects (snake_case here, camelCase on the wire).

Each class is one schema component of /api/schema/ with the same fields; the drift test holds them to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any


@dataclass(frozen=True, slots=True)
class Plan:
    id: str
    name: str
    vcpus: int
    memory_mib: int
    disk_gib: int
    monthly_price: Decimal
    hourly_price: Decimal
    storage_price: Decimal


@dataclass(frozen=True, slots=True)
class Desktop:
    id: str
    name: str
    workspace_id: str
    plan: Plan
    state: str
    private_ip: str | None
    image_profile: str
    image: dict[str, Any]
    driver: str
    driver_ref: str
    last_error: str
    progress: str
    labels: list[str]
    created_at: datetime
    updated_at: datetime
    state_changed_at: datetime


@dataclass(frozen=True, slots=True)
class DesktopEvent:
    id: str
    from_state: str
    to_state: str
    actor: str
    reason: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class BulkCreated:
    desktops: list[Desktop]


@dataclass(frozen=True, slots=True)
class BulkOutcome:
    desktop_id: str
    ok: bool
    name: str
    state: str
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class BulkResult:
    done: int
    refused: int
    results: list[BulkOutcome]


@dataclass(frozen=True, slots=True)
class LabelCount:
    name: str
    desktops: int


@dataclass(frozen=True, slots=True)
class FileWritten:
    path: str


@dataclass(frozen=True, slots=True)
class ExecResult:
    exit_code: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    duration_ms: int


@dataclass(frozen=True, slots=True)
class ScreenPoint:
    x: int
    y: int


@dataclass(frozen=True, slots=True)
class Screen:
    width: int
    height: int
    name: str
    cursor: ScreenPoint | None  # when the desktop's screen says where its pointer is


@dataclass(frozen=True, slots=True)
class Screenshot:
    """A screenshot in a JSON answer: `data` is the image, base64-encoded."""

    content_type: str
    data: str
    width: int
    height: int
    scale: float  # image pixels per screen pixel: (x, y) in the image is (x / scale, y / scale) on screen
    screen_width: int
    screen_height: int


@dataclass(frozen=True, slots=True)
class ScreenActionsDone:
    count: int
    screenshot: Screenshot | None


@dataclass(frozen=True, slots=True)
class ScreenImage:
    """`desktops.screenshot`'s answer: the image's bytes and how it maps to the screen."""

    data: bytes
    content_type: str
    scale: float  # image pixels per screen pixel: (x, y) in the image is (x / scale, y / scale) on screen
    screen_width: int
    screen_height: int


@dataclass(frozen=True, slots=True)
class AgentFailure:
    """Why an agent's turn failed, in words (`kind` is stable, `message` is for a person)."""

    kind: str
    message: str
    fix_url: str
    detail: str  # the provider's or the runtime's own words, where they say more


@dataclass(frozen=True, slots=True)
class ChatMessage:
    id: str
    author: str
    content: str
    status: str
    reply_to: str | None
    created_at: datetime
    completed_at: datetime | None
    input_tokens: int
    output_tokens: int
    model_requests: int
    failure: AgentFailure | None

    @property
    def finished(self) -> bool:
        return self.status in ("done", "error", "cancelled")


@dataclass(frozen=True, slots=True)
class ChatPiece:
    """What a streamed answer adds (`text`), with the answer as it stands (`message`)."""

    text: str
    message: ChatMessage


@dataclass(frozen=True, slots=True)
class RelaySession:
    mode: str
    expires_at: datetime
    vnc_url: str
    vnc_ticket: str
    terminal_url: str
    terminal_ticket: str


@dataclass(frozen=True, slots=True)
class ScheduleRun:
    id: str
    due_at: datetime
    status: str
    reply_id: str | None
    error: str
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Schedule:
    id: str
    desktop_id: str
    cron: str
    timezone: str
    message: str
    stop_after: bool
    enabled: bool
    next_run_at: datetime | None
    created_by: str | None
    created_at: datetime
    updated_at: datetime
    last_run: ScheduleRun | None


@dataclass(frozen=True, slots=True)
class AlertThresholds:
    """When a workspace's alerts fire."""

    memory_percent: int
    cpu_percent: int
    disk_percent: int
    sustained_seconds: int
    blocked_per_minute: int
    commands_per_minute: int
    long_turn_factor: int
    long_turn_minimum: int


@dataclass(frozen=True, slots=True)
class Workspace:
    id: str
    name: str
    agent_command: str
    control_role: str
    approval_role: str
    approval_timeout: int
    alert_thresholds: AlertThresholds
    approval_commands: list[str]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Membership:
    id: str
    email: str
    role: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Invitation:
    id: str
    workspace_id: str
    workspace_name: str
    email: str
    role: str
    invited_by: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: str
    workspace_id: str
    name: str
    prefix: str
    scope: str
    expires_at: datetime | None
    last_used_at: datetime | None
    created_by: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ApiKeyCreated(ApiKey):
    key: str


@dataclass(frozen=True, slots=True)
class LLMKey:
    id: str
    workspace_id: str
    provider: str
    name: str
    base_url: str
    model: str
    last4: str
    created_at: datetime
    updated_at: datetime
    # What the provider answered when asked from a running desktop: "" (not yet), accepted, refused,
    # unreachable, answered (another status, in check_detail).
    verdict: str
    check_detail: str
    checked_at: datetime | None


@dataclass(frozen=True, slots=True)
class AuditEvent:
    id: str
    at: datetime
    actor: str
    workspace_id: str
    action: str
    target: str
    ip: str | None
    request_id: str
    detail: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AgentUsage:
    input_tokens: int
    output_tokens: int
    requests: int
    turns: int


@dataclass(frozen=True, slots=True)
class DesktopUsage(AgentUsage):
    desktop_id: str
    name: str


@dataclass(frozen=True, slots=True)
class WorkspaceUsage:
    total: AgentUsage
    desktops: list[DesktopUsage]


@dataclass(frozen=True, slots=True)
class Tier:
    name: str
    monthly_fee: Decimal
    included_usage: Decimal
    max_desktops: int
    max_running: int
    max_disk_gib: int
    monthly_spend_cap: Decimal | None


@dataclass(frozen=True, slots=True)
class Quota:
    used: int
    limit: int
    percent: int | None


@dataclass(frozen=True, slots=True)
class SpendQuota:
    used: Decimal
    limit: Decimal | None
    percent: int | None


@dataclass(frozen=True, slots=True)
class QuotaUsage:
    tier: Tier
    desktops: Quota
    running: Quota
    disk_gib: Quota
    spend: SpendQuota


@dataclass(frozen=True, slots=True)
class Egress:
    """Where desktops may connect: `open`, `allowlist` (the entries, and the LLM keys' hosts) or `deny`."""

    mode: str
    entries: list[str]
    allow_llm_providers: bool
    llm_hosts: list[str]
    inherited: bool
    updated_at: datetime | None
    updated_by: str


@dataclass(frozen=True, slots=True)
class Usage:
    running_hours: Decimal
    suspended_hours: Decimal
    stopped_hours: Decimal
    gib_hours: Decimal
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class Cost:
    compute: Decimal
    storage: Decimal
    models: Decimal
    total: Decimal


@dataclass(frozen=True, slots=True)
class DayCosts:
    day: date
    running_desktops: int
    usage: Usage
    cost: Cost


@dataclass(frozen=True, slots=True)
class DesktopDayCosts:
    day: date
    usage: Usage
    cost: Cost


@dataclass(frozen=True, slots=True)
class DesktopCosts:
    desktop_id: str
    name: str
    state: str
    plan: str
    usage: Usage
    cost: Cost


@dataclass(frozen=True, slots=True)
class DesktopMonthCosts(DesktopCosts):
    days: list[DesktopDayCosts]


@dataclass(frozen=True, slots=True)
class SpendAlert:
    threshold: int
    spend: Decimal
    cap: Decimal
    created_at: datetime


@dataclass(frozen=True, slots=True)
class MonthCosts:
    workspace_id: str
    month: str
    currency: str
    tier: Tier
    usage: Usage
    cost: Cost
    fee: Decimal
    included: Decimal
    credits: Decimal
    owed: Decimal
    spend_cap: Decimal | None
    cap_used_percent: int | None
    agent_model: str
    model_priced: bool
    days: list[DayCosts]
    desktops: list[DesktopCosts]
    alerts: list[SpendAlert]


@dataclass(frozen=True, slots=True)
class ModelPrice:
    id: str
    model: str
    input_per_million: Decimal
    output_per_million: Decimal
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Approval:
    """An agent's request for approval (`bureau approve` in its desktop) and its answer."""

    id: str
    desktop: str
    desktop_name: str
    workspace_id: str
    title: str
    details: str
    cwd: str
    turn: str | None
    digest: str
    status: str
    requested_at: datetime
    expires_at: datetime
    decided_by: str
    decided_at: datetime | None
    comment: str
    has_screenshot: bool


@dataclass(frozen=True, slots=True)
class Alert:
    """What an alert rule found on a desktop, open until someone acknowledges it or it is resolved
    (`resolution`: `desktop_destroyed`)."""

    id: str
    workspace: str
    desktop: str
    desktop_name: str
    kind: str
    status: str
    message: str
    detail: dict[str, Any]
    raised_at: datetime
    acknowledged_by: str
    acknowledged_at: datetime | None
    resolution: str
    resolved_at: datetime | None


@dataclass(frozen=True, slots=True)
class BlockedAttempt:
    """A destination a desktop's egress policy refused (`via`: name or address), with its attempts."""

    via: str
    destination: str
    attempts: int
    first_at: datetime
    last_at: datetime


@dataclass(frozen=True, slots=True)
class Webhook:
    """Where a workspace's approval events go; `secret` only in the answer that made it."""

    url: str
    secret: str


@dataclass(frozen=True, slots=True)
class WebhookDelivery:
    id: str
    event: str
    url: str
    payload: dict[str, Any]
    status: str
    attempts: int
    response_status: int | None
    last_error: str
    created_at: datetime
    delivered_at: datetime | None
