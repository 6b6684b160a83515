"""Shapes of the API's JSON (snake_case here, camelCase on the wire); no logic beyond input checks."""

from rest_framework import serializers

from desktops.models import (
    ApiKey,
    ApiScope,
    AuditEvent,
    ChatMessage,
    Desktop,
    DesktopEvent,
    Invitation,
    LLMKey,
    LLMProvider,
    Membership,
    Plan,
    Role,
    Workspace,
    hostname_validator,
)
from desktops.selectors import chat_content


class PlanSerializer(serializers.ModelSerializer):
    class Meta:
        model = Plan
        fields = ["id", "name", "vcpus", "memory_mib", "disk_gib", "monthly_price"]


class DesktopSerializer(serializers.ModelSerializer):
    workspace_id = serializers.CharField(read_only=True)
    plan = PlanSerializer(read_only=True)

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
            "created_at",
            "updated_at",
            "state_changed_at",
        ]


class DesktopCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63, validators=[hostname_validator])
    workspace_id = serializers.CharField(required=False, help_text="Defaults to the key's workspace.")
    plan = serializers.CharField(required=False, help_text="Plan id or name; defaults to the default plan.")
    image_profile = serializers.ChoiceField(choices=["minimal", "full"], required=False)


class DesktopEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = DesktopEvent
        fields = ["id", "from_state", "to_state", "actor", "reason", "created_at"]


class WorkspaceSerializer(serializers.ModelSerializer):
    class Meta:
        model = Workspace
        fields = ["id", "name", "agent_command", "control_role", "created_at"]
        read_only_fields = ["agent_command", "control_role"]


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
        ]


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


class ChatMessageSerializer(serializers.ModelSerializer):
    reply_to = serializers.CharField(source="reply_to_id", read_only=True)
    content = serializers.SerializerMethodField(help_text="So far, while the agent is still answering.")

    def get_content(self, message) -> str:
        return chat_content(message)

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
        ]
