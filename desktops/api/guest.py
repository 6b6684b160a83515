"""The guest endpoint's face: what a desktop may ask of the control plane, and nothing else.

Served by a listener of its own (`lebureau.guest_asgi`), the only part of the control plane a desktop
can reach. Each call carries the desktop's own token (`/etc/bureau/token`, written at provision, new at
each rebuild, void once the desktop is destroyed) and acts on that desktop alone.
"""

from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.utils.translation import gettext_lazy as _
from drf_spectacular.utils import extend_schema
from rest_framework import authentication, exceptions, permissions, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from desktops import alerts, approvals, screen
from desktops.api import serializers as s
from desktops.api.rendering import ImageNegotiation
from desktops.api.views import BodyTooLarge
from desktops.audit import desktop_actor
from desktops.models import Approval, Desktop


class DesktopTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <the desktop's token>`; the request acts as that desktop."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode(errors="replace").split()
        if len(header) != 2 or header[0].lower() != self.keyword.lower():
            raise exceptions.NotAuthenticated(
                _("Give the desktop's token as `Authorization: Bearer <token>`.")
            )
        desktop = approvals.desktop_by_token(header[1])
        if desktop is None:
            raise exceptions.AuthenticationFailed(_("This desktop token is not valid."))
        return AnonymousUser(), desktop

    def authenticate_header(self, request):
        return self.keyword


class IsDesktop(permissions.BasePermission):
    def has_permission(self, request, view):
        return isinstance(request.auth, Desktop)


class GuestView(APIView):
    authentication_classes = [DesktopTokenAuthentication]
    permission_classes = [IsDesktop]

    def initial(self, request, *args, **kwargs):
        # Refused before a byte of it is parsed, as on the API: a desktop sends small JSON documents.
        if int(request.META.get("CONTENT_LENGTH") or 0) > settings.API_MAX_BODY_BYTES:
            raise BodyTooLarge
        super().initial(request, *args, **kwargs)

    @property
    def desktop(self) -> Desktop:
        return self.request.auth


class GuestDesktopSerializer(serializers.ModelSerializer):
    class Meta:
        model = Desktop
        fields = ["id", "name", "workspace"]


class ApprovalAskSerializer(serializers.Serializer):
    title = serializers.CharField(trim_whitespace=False, max_length=approvals.MAX_TITLE)
    details = serializers.CharField(
        required=False, default="", allow_blank=True, trim_whitespace=False, max_length=approvals.MAX_DETAILS
    )
    cwd = serializers.CharField(required=False, default="", allow_blank=True, trim_whitespace=False)
    timeout = serializers.IntegerField(required=False, min_value=1, max_value=approvals.MAX_TIMEOUT)


class ActivitySerializer(serializers.Serializer):
    # A report covers a few seconds of the agent's work: more than this is no report but a lie.
    commands = serializers.IntegerField(min_value=1, max_value=100_000)


class GuestApprovalSerializer(serializers.ModelSerializer):
    status = serializers.SerializerMethodField()
    decided_by = serializers.SerializerMethodField()
    timeout = serializers.SerializerMethodField()

    def get_status(self, approval) -> str:
        return approvals.approval_status(approval)

    def get_decided_by(self, approval) -> str:
        return approval.decided_by.email if approval.decided_by else ""

    def get_timeout(self, approval) -> int:
        return int((approval.expires_at - approval.requested_at).total_seconds())

    class Meta:
        model = Approval
        fields = [
            "id",
            "title",
            "status",
            "digest",
            "expires_at",
            "timeout",
            "decided_by",
            "decided_at",
            "comment",
        ]


class WhoAmI(GuestView):
    @extend_schema(exclude=True)
    def get(self, request):
        """The desktop the token belongs to."""
        return Response(GuestDesktopSerializer(self.desktop).data)


class ApprovalAsk(GuestView):
    throttle_scope = "approvals"

    @extend_schema(exclude=True)
    def post(self, request):
        """Ask the desktop's operators for their approval; poll the answer at its own address."""
        data = ApprovalAskSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        approval = approvals.approval_request(desktop=self.desktop, **data.validated_data)
        return Response(GuestApprovalSerializer(approval).data, status=status.HTTP_201_CREATED)


class ApprovalAnswer(GuestView):
    @extend_schema(exclude=True)
    def get(self, request, approval_id):
        """Where the request stands: pending, approved, denied or expired, with the operator's comment."""
        approval = approvals.approval_for_desktop(desktop=self.desktop, approval_id=approval_id)
        return Response(GuestApprovalSerializer(approval).data)


class Activity(GuestView):
    @extend_schema(exclude=True)
    def post(self, request):
        """What the desktop's agent runtime did since its last report: how many commands it ran."""
        data = ActivitySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        alerts.agent_commands_record(desktop=self.desktop, **data.validated_data)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ScreenLook(GuestView):
    throttle_scope = "screenshot"
    # `?format=` names the image's format, as on the API; the answer is JSON all the same.
    content_negotiation_class = ImageNegotiation

    @extend_schema(exclude=True)
    def get(self, request):
        """The desktop's own screen, as the API's screenshot: the image (base64), its size and scale."""
        query = s.ScreenshotQuery(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        options = screen.ScreenshotOptions(query.validated_data["format"], query.validated_data.get("width"))
        shot = screen.screen_screenshot(
            desktop=self.desktop, options=options, caller=desktop_actor(self.desktop)
        )
        return Response(s.ScreenshotSerializer(shot).data)


class ScreenActions(GuestView):
    throttle_scope = "actions"

    @extend_schema(exclude=True)
    def post(self, request):
        """The desktop's agent acts on its own screen: the API's batch of actions, checked whole first."""
        body = s.ScreenActionsSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        options = screen.ScreenshotOptions(data["format"], data.get("width")) if data["screenshot"] else None
        done = screen.screen_act_by_agent(desktop=self.desktop, actions=data["actions"], screenshot=options)
        return Response(s.ScreenActionsDoneSerializer(done).data)
