from django.conf import settings
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

from desktops.ids import PublicIdField

hostname_validator = RegexValidator(
    r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
    _("Use 1 to 63 lowercase letters, digits or hyphens, not starting or ending with a hyphen."),
)


class Role(models.TextChoices):
    VIEWER = "viewer", _("Viewer")
    MEMBER = "member", _("Member")
    ADMIN = "admin", _("Admin")
    OWNER = "owner", _("Owner")

    @property
    def rank(self) -> int:
        return list(Role).index(self)


def default_approval_commands() -> list[str]:
    """What a new workspace's agents ask before running: publishing, clusters, infrastructure, root."""
    return ["git push", "kubectl", "terraform apply", "sudo"]


# OpenClaw's gateway, kept warm in the desktop, through the guest helper (a cold
# `openclaw agent --local` per message spends ~15 s starting Node.js). `--message=` so that a
# message starting with "-" is still taken as the message.
DEFAULT_AGENT_COMMAND = "bureau openclaw --session={session} --message={message}"
# The image profile without that runtime: a screen and a terminal only.
MINIMAL_PROFILE = "minimal"


class Workspace(models.Model):
    id = PublicIdField("ws")
    name = models.CharField(max_length=100)
    agent_command = models.CharField(
        max_length=500,
        default=DEFAULT_AGENT_COMMAND,
        help_text="Run in a desktop for each chat message; {session} and {message} are filled in, quoted.",
    )
    # Who may take control of a desktop (its screen, terminal and agent) and so read what is in it,
    # the workspace's LLM keys included: never viewers; members by default.
    control_role = models.CharField(
        max_length=10,
        choices=[(r.value, r.label) for r in (Role.MEMBER, Role.ADMIN, Role.OWNER)],
        default=Role.MEMBER,
    )
    # Who may answer an agent's request for approval, and how long a request waits by default (an
    # unanswered one is refused then: the agent is told it timed out and goes no further).
    approval_role = models.CharField(
        max_length=10,
        choices=[(r.value, r.label) for r in (Role.MEMBER, Role.ADMIN, Role.OWNER)],
        default=Role.MEMBER,
    )
    approval_timeout = models.PositiveIntegerField(
        default=30 * 60, validators=[MinValueValidator(10)], help_text="Seconds a request for approval waits"
    )
    # Commands the agent runs only once someone approved them: OpenClaw asks by itself, the agent need
    # not remember to (desktops/agent_config.py). Patterns of words, e.g. "git push".
    approval_commands = models.JSONField(default=default_approval_commands, blank=True)
    # Told of every request for approval and answer, signed with the workspace's webhook secret.
    approval_webhook_url = models.URLField(max_length=500, blank=True)
    webhook_secret_encrypted = models.TextField(blank=True)
    # When its alerts fire: the thresholds its admins changed from the defaults (desktops.alerts).
    alert_thresholds = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"{self.name} ({self.id})"


class Membership(models.Model):
    id = PublicIdField("mem")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "user"], name="one_membership_per_user")]

    def __str__(self):
        return f"{self.user} is {self.role} of {self.workspace_id}"


class Invitation(models.Model):
    """A place in a workspace offered to an e-mail address; whoever confirms the address answers it."""

    id = PublicIdField("inv")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=10, choices=Role.choices)
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    accepted_at = models.DateTimeField(null=True, blank=True)
    declined_at = models.DateTimeField(null=True, blank=True)
    # Who opened the e-mailed link, signed in with an account holding the address (confirmed or not):
    # what the inviters see of the invitee's progress, and only once the invitee acts on the invitation.
    opened_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    opened_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "email"], name="one_invitation_per_email")
        ]

    def __str__(self):
        return f"{self.email} invited to {self.workspace_id} as {self.role}"


class Plan(models.Model):
    id = PublicIdField("plan")
    name = models.SlugField(max_length=40, unique=True)
    vcpus = models.PositiveSmallIntegerField(validators=[MinValueValidator(1)])
    memory_mib = models.PositiveIntegerField(validators=[MinValueValidator(256)])
    disk_gib = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    monthly_price = models.DecimalField(max_digits=8, decimal_places=2, help_text="EUR per month")
    transfer_max_mib = models.PositiveIntegerField(
        default=1024, help_text="The largest file or folder moved into or out of a desktop at once, in MiB"
    )
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["monthly_price"]

    def __str__(self):
        return self.name


class DesktopState(models.TextChoices):
    # The API says the value; a page says the label, in the reader's language.
    PROVISIONING = "provisioning", pgettext_lazy("desktop state", "provisioning")
    RUNNING = "running", pgettext_lazy("desktop state", "running")
    STOPPING = "stopping", pgettext_lazy("desktop state", "stopping")
    STOPPED = "stopped", pgettext_lazy("desktop state", "stopped")
    STARTING = "starting", pgettext_lazy("desktop state", "starting")
    SUSPENDING = "suspending", pgettext_lazy("desktop state", "suspending")
    SUSPENDED = "suspended", pgettext_lazy("desktop state", "suspended")
    RESUMING = "resuming", pgettext_lazy("desktop state", "resuming")
    DESTROYING = "destroying", pgettext_lazy("desktop state", "destroying")
    DESTROYED = "destroyed", pgettext_lazy("desktop state", "destroyed")
    ERROR = "error", pgettext_lazy("desktop state", "error")


class Desktop(models.Model):
    id = PublicIdField("dsk")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="desktops")
    name = models.CharField(max_length=63, validators=[hostname_validator])
    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, related_name="desktops")
    image_profile = models.CharField(max_length=40)
    driver = models.CharField(max_length=100, help_text="Compute engine running this desktop")
    driver_ref = models.CharField(max_length=100, blank=True, help_text="The engine's name for it")
    engine_instance = models.CharField(
        max_length=200, blank=True, help_text="Which installation of the engine holds it (a host, a cluster)"
    )
    state = models.CharField(max_length=20, choices=DesktopState.choices, default=DesktopState.PROVISIONING)
    private_ip = models.GenericIPAddressField(null=True, blank=True)
    last_error = models.TextField(blank=True, help_text="What went wrong, in words for its owner")
    # The engine's own words (host paths, cluster nodes): for support staff only, never in the API.
    error_detail = models.TextField(blank=True)
    progress = models.CharField(max_length=20, blank=True, help_text="The provision step under way")
    # Set while a worker carries out a step for it (until the step's time limit at the latest): the
    # workspace's steps under way are counted from it, so that one workspace cannot fill the queue.
    step_until = models.DateTimeField(null=True, blank=True)
    # The task holding that slot: a copy of the same message (redelivered after its worker died) takes
    # the step over, another copy of the step (re-sent by reconcile) waits until the slot is free.
    step_holder = models.CharField(max_length=64, blank=True)
    ssh_host_key = models.TextField(blank=True, help_text="Pinned on first contact, checked after")
    agent_token_hash = models.CharField(max_length=64, blank=True, help_text="HMAC of the helper's token")
    # Commands its agent runtime has run so far, as the runtime reports them through the guest endpoint;
    # the alerts make a rate of it. Only ever added to (an UPDATE with F()), never written whole.
    agent_commands = models.PositiveBigIntegerField(default=0)
    image = models.JSONField(default=dict, blank=True, help_text="The golden image it was made from")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "name"],
                condition=~Q(state=DesktopState.DESTROYED),
                name="desktop_name_unique_in_workspace",
                violation_error_message=_("A desktop with this name already exists in the workspace."),
            )
        ]
        indexes = [
            models.Index(fields=["workspace", "state"]),
            models.Index(fields=["workspace", "-created_at"]),
        ]

    def __str__(self):
        return f"{self.name} ({self.id})"


class DesktopEvent(models.Model):
    """One state change of a desktop, with who or what caused it."""

    id = PublicIdField("evt")
    desktop = models.ForeignKey(Desktop, on_delete=models.CASCADE, related_name="events")
    from_state = models.CharField(max_length=20, blank=True, choices=DesktopState.choices)
    to_state = models.CharField(max_length=20, choices=DesktopState.choices)
    actor = models.CharField(max_length=200)
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self):
        return f"{self.desktop_id}: {self.from_state or '-'} -> {self.to_state}"


class ApiScope(models.TextChoices):
    READ = "read"
    WRITE = "write"


class ApiKey(models.Model):
    """A platform key: only its prefix and an HMAC of the whole token are stored."""

    id = PublicIdField("key")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    hashed = models.CharField(max_length=64)
    scope = models.CharField(max_length=5, choices=ApiScope.choices, default=ApiScope.WRITE)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"

    def usable(self) -> bool:
        """Neither revoked nor expired: what it opened or made may still act."""
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > timezone.now())


class LLMProvider(models.TextChoices):
    ANTHROPIC = "anthropic"
    OPENAI = "openai"
    OPENROUTER = "openrouter"
    OPENAI_COMPATIBLE = "openai_compatible", "OpenAI-compatible"


class LLMKey(models.Model):
    """A workspace's own (BYOK) model provider key, encrypted at rest."""

    id = PublicIdField("llm")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="llm_keys")
    provider = models.CharField(max_length=20, choices=LLMProvider.choices)
    name = models.CharField(max_length=100)
    base_url = models.URLField(blank=True)
    # The model the agent uses through this key; blank takes the provider's default.
    model = models.CharField(max_length=200, blank=True)
    secret_encrypted = models.TextField()
    last4 = models.CharField(max_length=4)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Verdict(models.TextChoices):
        UNCHECKED = "", "not checked yet"
        ACCEPTED = "accepted"
        REFUSED = "refused"
        UNREACHABLE = "unreachable"
        ANSWERED = "answered", "answered otherwise"

    # What the provider said of this secret when last asked from one of the workspace's desktops.
    verdict = models.CharField(max_length=12, choices=Verdict.choices, blank=True)
    check_detail = models.CharField(max_length=300, blank=True)
    checked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "name"],
                name="llm_key_name_unique_in_workspace",
                violation_error_message="An LLM key with this name already exists in the workspace.",
            )
        ]

    def __str__(self):
        return f"{self.name} ({self.provider} …{self.last4})"


class AuditEvent(models.Model):
    """Append-only trail: a database trigger refuses UPDATE, and DELETE of events no checkpoint covers.

    Each event carries the hash of the one before it (desktops/audit.py writes and verifies the chain).
    No foreign keys, so the trail outlives the users, keys and workspaces it names.
    """

    id = PublicIdField("aud")
    # Position in the chain, without gaps: a missing number is a deleted event.
    seq = models.BigIntegerField(unique=True)
    # Set when the event takes its place in the chain, so that the hash covers it.
    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.CharField(max_length=200)
    workspace_id = models.CharField(max_length=32, blank=True, db_index=True)
    action = models.CharField(max_length=60, db_index=True)
    target = models.CharField(max_length=200, blank=True, db_index=True)
    ip = models.GenericIPAddressField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    prev_hash = models.CharField(max_length=64, blank=True)
    hash = models.CharField(max_length=64)

    class Meta:
        ordering = ["-at"]

    def __str__(self):
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.target}"


class AuditChainHead(models.Model):
    """The audit chain's last link, one row: each append locks it, so no two events chain onto the same one.

    It also tells a verifier how long the chain is, so that deleting its newest events shows.
    """

    seq = models.BigIntegerField(default=0)
    hash = models.CharField(max_length=64, blank=True)

    def __str__(self):
        return f"#{self.seq} {self.hash}"


class AuditCheckpoint(models.Model):
    """Where a pruned audit trail starts: the last pruned event's place and hash, signed with
    AUDIT_CHECKPOINT_KEY so that nobody without the key can declare events pruned (append-only too)."""

    seq = models.BigIntegerField(unique=True)
    hash = models.CharField(max_length=64)
    at = models.DateTimeField(default=timezone.now)
    signature = models.CharField(max_length=64)

    def __str__(self):
        return f"#{self.seq} {self.hash}"


class ChatMessage(models.Model):
    """One message of a desktop's conversation with its agent; kept for good."""

    class Author(models.TextChoices):
        OPERATOR = "operator"
        AGENT = "agent"

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        ERROR = "error"
        CANCELLED = "cancelled"

    id = PublicIdField("msg")
    desktop = models.ForeignKey(Desktop, on_delete=models.CASCADE, related_name="messages")
    author = models.CharField(max_length=10, choices=Author.choices)
    content = models.TextField(blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.DONE)
    reply_to = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="replies"
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    # When a worker started the turn: it may have waited, queued, behind others (an agent reply only).
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    # The bridge's place in the agent's output (bytes), so a new worker picks up where one died.
    output_offset = models.PositiveBigIntegerField(default=0)
    # Set by the worker following the turn; a stale one means nobody is following it.
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # Who follows the turn now: a follower whose token was replaced stops writing.
    follower = models.UUIDField(null=True, blank=True)
    # What the agent's turn cost, as its runtime reported it.
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    model_requests = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["created_at"]

    def __str__(self):
        return f"{self.author} on {self.desktop_id}: {self.content[:40]}"


class RelayTicket(models.Model):
    """One relay (screen or terminal) a person may open once: minted by the API, claimed by the relay.

    Only a hash of the ticket is kept. It is bound to what minted it (a browser session or an API
    key) and opens exactly one relay; the row then records that relay until it closes.
    """

    class Kind(models.TextChoices):
        VNC = "vnc"
        TERMINAL = "terminal"

    class Mode(models.TextChoices):
        VIEW = "view"
        CONTROL = "control"

    id = PublicIdField("rly")
    ticket_hash = models.CharField(max_length=64, unique=True)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    mode = models.CharField(max_length=10, choices=Mode.choices)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    desktop = models.ForeignKey(Desktop, on_delete=models.CASCADE, related_name="relay_tickets")
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    session_hash = models.CharField(max_length=64, blank=True, help_text="Hash of the minting session's key")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    opened_at = models.DateTimeField(null=True, blank=True)
    # Refreshed by the open relay; a relay whose process died stops counting once this is stale.
    seen_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["user", "closed_at", "seen_at"])]

    def __str__(self):
        return f"{self.kind} {self.mode} relay of {self.desktop_id} for user {self.user_id}"


class ChatChunk(models.Model):
    """A piece of an agent's answer while it streams in: appended, never rewritten.

    The answer's whole text goes into ChatMessage.content once, when the turn ends, and its pieces go.
    """

    message = models.ForeignKey(ChatMessage, on_delete=models.CASCADE, related_name="chunks")
    text = models.TextField()

    class Meta:
        ordering = ["id"]

    def __str__(self):
        return f"{len(self.text)} characters of {self.message_id}"


label_validator = RegexValidator(
    r"^[a-z0-9]([a-z0-9._=:/-]{0,61}[a-z0-9])?$",
    _("Use 1 to 63 lowercase letters, digits or . _ = : / -, starting and ending with a letter or digit."),
)


class DesktopLabel(models.Model):
    """A name a desktop is filed under (`ci`, `team-a`, `env=prod`), to find and act on a fleet by it."""

    desktop = models.ForeignKey(Desktop, on_delete=models.CASCADE, related_name="labels")
    name = models.CharField(max_length=63, validators=[label_validator])

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["desktop", "name"], name="one_label_per_desktop")]
        indexes = [models.Index(fields=["name"])]

    def __str__(self):
        return f"{self.desktop_id}: {self.name}"


class Schedule(models.Model):
    """A message sent to a desktop's agent on a cron schedule, as the person who made the schedule."""

    id = PublicIdField("sch")
    desktop = models.ForeignKey(Desktop, on_delete=models.CASCADE, related_name="schedules")
    cron = models.CharField(max_length=100, help_text="Five fields: minute hour day month weekday")
    timezone = models.CharField(max_length=64, default="UTC", help_text="The cron expression's time zone")
    message = models.TextField()
    # Stop the desktop once the agent has answered (it is started first if stopped, whatever this says).
    stop_after = models.BooleanField(default=False)
    enabled = models.BooleanField(default=True)
    # Claimed by beat with a conditional UPDATE to the run after now: missed runs make one run, not many.
    next_run_at = models.DateTimeField(null=True, blank=True, db_index=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    # Made (or last changed) with an API key: it runs only while that key is valid, deleted keys included.
    created_with_key = models.ForeignKey(
        ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="schedules"
    )
    made_with_key = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self):
        return f"{self.cron} on {self.desktop_id}"


class ScheduleRun(models.Model):
    """One time a schedule came due: the desktop started if need be, the message sent, the answer awaited."""

    class Status(models.TextChoices):
        PENDING = "pending"
        STARTING = "starting", "Starting the desktop"
        SENT = "sent", "Sent, awaiting the answer"
        DONE = "done"
        FAILED = "failed"

    id = PublicIdField("run")
    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="runs")
    due_at = models.DateTimeField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    reply = models.ForeignKey(
        ChatMessage, null=True, blank=True, on_delete=models.SET_NULL, related_name="schedule_runs"
    )
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.schedule_id} due {self.due_at:%Y-%m-%d %H:%M}: {self.status}"


class EgressMode(models.TextChoices):
    OPEN = "open", _("Open: anywhere on the internet")
    ALLOWLIST = "allowlist", _("Allow-list: only the domains and networks listed")
    DENY = "deny", _("Deny all: no internet")


class EgressPolicy(models.Model):
    """Where desktops may connect: a workspace's (``desktop`` empty) or one desktop's, which replaces it.

    Private, link-local and metadata networks stay out of reach and the guest endpoint in reach
    whatever this says: those are the engine's, not a policy's.
    """

    id = PublicIdField("egr")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="egress_policies")
    desktop = models.OneToOneField(
        Desktop, null=True, blank=True, on_delete=models.CASCADE, related_name="egress_policy"
    )
    mode = models.CharField(max_length=10, choices=EgressMode.choices)
    # Domains (`pypi.org`, `*.github.com`) and IPv4 networks (`203.0.113.0/24`), checked by the services.
    entries = models.JSONField(default=list, blank=True)
    # In allow-list mode, also the hosts of the workspace's LLM keys (their providers' APIs).
    allow_llm_providers = models.BooleanField(default=True)
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["workspace"], condition=Q(desktop=None), name="one_egress_policy_per_workspace"
            )
        ]

    def __str__(self):
        return f"{self.mode} egress of {self.desktop_id or self.workspace_id}"


class Approval(models.Model):
    """An agent's request for a person's approval, bound to exactly what it asked (its digest), and the
    decision, once: who, when, with what comment. The request itself is never changed."""

    class Status(models.TextChoices):
        PENDING = "pending", _("Waiting")
        APPROVED = "approved", _("Approved")
        DENIED = "denied", _("Denied")
        EXPIRED = "expired", _("Timed out")

    id = PublicIdField("apr")
    desktop = models.ForeignKey(Desktop, on_delete=models.CASCADE, related_name="approvals")
    title = models.CharField(max_length=200)
    details = models.TextField(blank=True)
    cwd = models.CharField(max_length=1000, blank=True, help_text="Where the agent was when it asked")
    # The agent's turn under way when it asked: the conversation the request belongs to.
    turn = models.ForeignKey(
        "ChatMessage", null=True, blank=True, on_delete=models.SET_NULL, related_name="approvals"
    )
    digest = models.CharField(max_length=64, help_text="sha256 of what was asked, as the desktop computes it")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    requested_at = models.DateTimeField(auto_now_add=True, db_index=True)
    expires_at = models.DateTimeField()
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(blank=True)

    class Meta:
        ordering = ["-requested_at"]
        indexes = [models.Index(fields=["status", "expires_at"])]

    def __str__(self):
        return f"{self.title} ({self.status}) on {self.desktop_id}"


class ApprovalScreenshot(models.Model):
    """The asking desktop's screen, taken moments after it asked: what the agent was looking at."""

    approval = models.OneToOneField(Approval, on_delete=models.CASCADE, related_name="screenshot")
    image = models.BinaryField()
    content_type = models.CharField(max_length=40)
    taken_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"screen of {self.approval_id}"


class WebhookDelivery(models.Model):
    """One event sent to a workspace's webhook: what was sent, and how each attempt went."""

    class Status(models.TextChoices):
        PENDING = "pending", _("Sending")
        DELIVERED = "delivered", _("Delivered")
        FAILED = "failed", _("Failed")

    id = PublicIdField("whd")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="webhook_deliveries")
    event = models.CharField(max_length=60)
    url = models.URLField(max_length=500)
    payload = models.JSONField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    response_status = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.event} to {self.url}: {self.status}"


class Alert(models.Model):
    """Something about a desktop its operators should know (desktops.alerts), until one acknowledges it
    or its cause is gone for good (the desktop destroyed).

    One open alert per rule and desktop; and one alert per cause (the occurrence: a stay in `error`, a
    failed turn, a spell of memory use above the threshold), so an acknowledged cause is not raised again.
    """

    class Kind(models.TextChoices):
        ERROR = "error", _("Desktop in error")
        STUCK = "stuck", _("Step stuck")
        MEMORY = "memory", _("Memory")
        CPU = "cpu", _("CPU")
        DISK = "disk", _("Disk")
        AGENT = "agent", _("Agent runtime")
        LONG_TURN = "long_turn", _("Long turn")
        EGRESS = "egress", _("Blocked connections")
        COMMANDS = "commands", _("Burst of commands")

    class Status(models.TextChoices):
        OPEN = "open", _("Open")
        ACKNOWLEDGED = "acknowledged", _("Acknowledged")
        # Closed without a person: its cause is gone for good (see `resolution`).
        RESOLVED = "resolved", _("Resolved")

    class Resolution(models.TextChoices):
        DESKTOP_DESTROYED = "desktop_destroyed", _("The desktop was destroyed.")

    id = PublicIdField("alr")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="alerts")
    desktop = models.ForeignKey(Desktop, on_delete=models.CASCADE, related_name="alerts")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    cause = models.CharField(max_length=200)
    # The figures the rule saw (a percentage, a count, an error's words): the message is made from them
    # in the reader's language.
    detail = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=15, choices=Status.choices, default=Status.OPEN)
    raised_at = models.DateTimeField(auto_now_add=True, db_index=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    resolution = models.CharField(max_length=30, choices=Resolution.choices, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-raised_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["desktop", "kind"], condition=Q(status="open"), name="one_open_alert_per_rule"
            ),
            models.UniqueConstraint(fields=["desktop", "kind", "cause"], name="one_alert_per_cause"),
        ]
        indexes = [models.Index(fields=["workspace", "status"])]

    def __str__(self):
        return f"{self.kind} on {self.desktop_id}: {self.status}"


class AlertWatch(models.Model):
    """What a rule remembers of a desktop between two evaluations: since when its condition holds (a
    spell above a threshold), and its last reading (to make a rate of a counter)."""

    desktop = models.ForeignKey(Desktop, on_delete=models.CASCADE, related_name="alert_watches")
    kind = models.CharField(max_length=20)
    since = models.DateTimeField(null=True, blank=True)
    reading = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["desktop", "kind"], name="one_watch_per_rule")]

    def __str__(self):
        return f"{self.kind} of {self.desktop_id} since {self.since}"


class BlockedAttempt(models.Model):
    """A destination a desktop's egress policy refused, with how many attempts were counted so far."""

    class Via(models.TextChoices):
        NAME = "name", _("Look-up refused")
        ADDRESS = "address", _("Packets dropped")

    desktop = models.ForeignKey(Desktop, on_delete=models.CASCADE, related_name="blocked_attempts")
    via = models.CharField(max_length=10, choices=Via.choices)
    destination = models.CharField(max_length=253)
    attempts = models.PositiveBigIntegerField(default=0)
    # The engine's own counter when last read: it only grows, until the engine forgets the destination.
    engine_count = models.PositiveBigIntegerField(default=0)
    first_at = models.DateTimeField(auto_now_add=True)
    last_at = models.DateTimeField()

    class Meta:
        ordering = ["-last_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["desktop", "via", "destination"], name="one_count_per_blocked_destination"
            )
        ]

    def __str__(self):
        return f"{self.desktop_id} -> {self.destination}: {self.attempts}"
