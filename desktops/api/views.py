"""Thin views: parse input, call a selector or a service, shape the output."""

import shlex
from collections.abc import Mapping

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.http import HttpResponse, StreamingHttpResponse
from django.utils.http import content_disposition_header
from django.utils.translation import gettext_lazy as _
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException
from rest_framework.response import Response

from billing import services as billing
from billing.metering import this_month
from billing.selectors import (
    agent_usage_of_desktop,
    agent_usage_of_workspace,
    costs_of_desktop,
    costs_of_workspace,
    model_price_list,
    quota_of,
    tier_list,
)
from desktops import (
    alerts,
    approvals,
    bulk,
    chat,
    egress,
    files,
    schedules,
    screen,
    selectors,
    services,
    webhooks,
)
from desktops.api import serializers as s
from desktops.api.rendering import ImageNegotiation
from desktops.audit import Actor
from desktops.commands import desktop_exec
from desktops.egress_blocked import blocked_attempts_of
from desktops.errors import Forbidden
from desktops.labels import desktops_label
from desktops.models import DesktopState, Role
from desktops.relays import relay_tickets_mint


class BodyTooLarge(APIException):
    status_code = 413
    default_code = "too_large"
    default_detail = _("The request's body is too large for the API.")


# What a 409 means where the services can answer one (desktops.errors.Conflict).
NOT_NOW = OpenApiResponse(description=_("Not allowed in the current state"))
UNCONFIRMED = OpenApiResponse(
    description=_(
        "On a tier without a fee, no owner of the workspace has confirmed an e-mail address yet "
        "(code email_unconfirmed)"
    )
)
TOO_LARGE = OpenApiResponse(description=_("More than the desktop's plan moves at once"))


async def streamed(chunks):
    """A download's chunks, each read in a thread as the client takes it: the web server streams
    instead of gathering the whole file first (what it does with a plain iterator)."""
    end = object()
    try:
        while (chunk := await sync_to_async(next, thread_sensitive=False)(chunks, end)) is not end:
            yield chunk
    finally:
        await sync_to_async(chunks.close, thread_sensitive=False)()


STEPS = ("start", "stop", "suspend", "resume")
SCREENSHOT_HEADERS = _(
    "X-Screen-Width and X-Screen-Height give the screen's size, X-Screenshot-Scale the image's pixels per"
    " screen pixel: a point (x, y) in the image is (x / scale, y / scale) on the screen."
)
SCREEN_DOWN = OpenApiResponse(description=_("The desktop's screen is not answering (try again)"))
BULK_STEPS = (*STEPS, "destroy")


class WorkspaceQuery(serializers.Serializer):
    workspace = serializers.CharField(required=False, help_text="Workspace id (ws_…)")


class ApiViewSet(viewsets.GenericViewSet):
    """Base of every endpoint: knows its actor. What people do is audited by the services they call;
    reads (a page polling, a script listing) are not. An action's `throttle_scope` limits its rate per
    person (throttling.py)."""

    throttle_scope: str | None = None
    throttle_writes_only = False

    @property
    def actor(self) -> Actor:
        return Actor.from_request(self.request)

    def initial(self, request, *args, **kwargs):
        # Refused before a byte of it is parsed: the API takes small JSON documents only (an upload
        # of a file into a desktop is held to its plan's size instead, and never parsed).
        too_large = int(request.META.get("CONTENT_LENGTH") or 0) > settings.API_MAX_BODY_BYTES
        if too_large and self.action != "files":
            raise BodyTooLarge
        super().initial(request, *args, **kwargs)

    def workspace(self, workspace_id: str | None, minimum: Role = Role.VIEWER):
        if workspace_id:
            workspace = selectors.workspace_get(actor=self.actor, workspace_id=workspace_id, minimum=minimum)
        else:
            workspace = selectors.workspace_default(actor=self.actor)
            selectors.workspace_get(actor=self.actor, workspace_id=workspace.id, minimum=minimum)
        return workspace

    def managed(self) -> str | None:
        """The `?workspace=` a key list is narrowed to, once the actor is known to manage it."""
        workspace_id = self.query(WorkspaceQuery).get("workspace")
        return workspace_id and self.workspace(workspace_id, minimum=Role.ADMIN).id

    def valid(self, serializer_class, data):
        serializer = serializer_class(data=data)
        _strings_only(serializer, data)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data

    def query(self, serializer_class):
        """The query string, validated. A plain dict, because DRF reads a form's (a QueryDict's) empty
        value as no value: ``?workspace=`` must be refused, not taken for "every workspace"."""
        return self.valid(serializer_class, self.request.query_params.dict())

    def page(self, queryset, serializer_class):
        page = self.paginate_queryset(queryset)
        return self.get_paginated_response(serializer_class(page, many=True).data)


def _strings_only(serializer, data) -> None:
    """A text field takes a JSON string, as the schema says; DRF would take a number and str() it."""
    if not isinstance(data, Mapping):
        return  # DRF's own check answers that
    wrong = {
        name: [field.error_messages["invalid"]]
        for name, field in serializer.fields.items()
        if isinstance(field, serializers.CharField)
        and not field.read_only
        and data.get(name) is not None
        and not isinstance(data[name], str)
    }
    if wrong:
        raise serializers.ValidationError(wrong)


class DesktopListQuery(serializers.Serializer):
    state = serializers.ChoiceField(choices=DesktopState.choices, required=False)
    workspace = serializers.CharField(required=False, help_text="Workspace id (ws_…)")
    label = serializers.CharField(
        required=False, help_text="Desktops with this label (several: a,b has both)."
    )
    name = serializers.CharField(required=False, help_text="The desktop of this name.")


class DesktopViewSet(ApiViewSet):
    serializer_class = s.DesktopSerializer

    @extend_schema(parameters=[DesktopListQuery])
    def list(self, request):
        query = self.query(DesktopListQuery)
        if query.get("workspace"):
            self.workspace(query["workspace"])
        desktops = selectors.desktop_list(
            actor=self.actor,
            workspace_id=query.get("workspace"),
            state=query.get("state"),
            labels=[label for label in query.get("label", "").split(",") if label],
            name=query.get("name"),
        )
        return self.page(desktops, s.DesktopSerializer)

    @extend_schema(
        request=s.DesktopCreateSerializer,
        responses={
            201: s.DesktopSerializer,
            403: UNCONFIRMED,
            409: OpenApiResponse(description="Past a quota of the workspace's tier (code quota_exceeded)"),
        },
    )
    def create(self, request):
        data = self.valid(s.DesktopCreateSerializer, request.data)
        workspace = self.workspace(data.get("workspace_id"), minimum=Role.MEMBER)
        desktop = services.desktop_create(
            actor=self.actor,
            workspace=workspace,
            plan=selectors.plan_get(plan=data.get("plan")),
            name=data["name"],
            image_profile=data.get("image_profile", ""),
            labels=data.get("labels", ()),
        )
        headers = {"Location": f"/api/desktops/{desktop.id}"}
        return Response(s.DesktopSerializer(desktop).data, status=status.HTTP_201_CREATED, headers=headers)

    def retrieve(self, request, pk):
        return Response(s.DesktopSerializer(self._desktop(pk)).data)

    @extend_schema(responses={202: s.DesktopSerializer, 409: NOT_NOW})
    def destroy(self, request, pk):
        return self._act(pk, "destroy")

    @extend_schema(
        operation_id="desktops_act",
        request=None,
        parameters=[OpenApiParameter("step", OpenApiTypes.STR, OpenApiParameter.PATH, enum=STEPS)],
        responses={
            202: s.DesktopSerializer,
            409: OpenApiResponse(
                description="Not allowed in the current state, or past a quota of the workspace's tier"
            ),
        },
    )
    @action(detail=True, methods=["post"], url_path=rf"(?P<step>{'|'.join(STEPS)})")
    def act(self, request, pk, step):
        return self._act(pk, step)

    @extend_schema(responses=s.DesktopEventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request, pk):
        return self.page(selectors.desktop_events(desktop=self._desktop(pk)), s.DesktopEventSerializer)

    @extend_schema(methods=["GET"], responses=s.ChatMessageSerializer(many=True))
    @extend_schema(methods=["POST"], request=s.ChatSendSerializer, responses={202: s.ChatMessageSerializer})
    @action(detail=True, methods=["get", "post"], throttle_scope="chat", throttle_writes_only=True)
    def chat(self, request, pk):
        """The conversation with the desktop's agent; POST a message, the answer arrives in it."""
        if request.method == "GET":
            return self.page(selectors.chat_list(desktop=self._desktop(pk)), s.ChatMessageSerializer)
        desktop = self._desktop(pk)  # who may, before reading what they sent
        message = self.valid(s.ChatSendSerializer, request.data)["message"]
        reply = services.chat_send(actor=self.actor, desktop=desktop, message=message)
        return Response(s.ChatMessageSerializer(reply).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses=s.AgentUsageSerializer)
    @action(detail=True, methods=["get"])
    def usage(self, request, pk):
        """Tokens and model requests the desktop's agent used, over all its answered messages."""
        return Response(s.AgentUsageSerializer(agent_usage_of_desktop(self._desktop(pk))).data)

    @extend_schema(parameters=[s.CostsQuery], responses=s.DesktopMonthCostsSerializer)
    @action(detail=True, methods=["get"])
    def costs(self, request, pk):
        """What the desktop used and cost in a month (`?month=YYYY-MM`, this one by default), day by day."""
        month = self.valid(s.CostsQuery, request.query_params).get("month") or this_month()
        costs = costs_of_desktop(actor=self.actor, desktop_id=self._desktop(pk).id, month=month)
        return Response(s.DesktopMonthCostsSerializer(costs).data)

    @extend_schema(request=s.RelaySessionRequestSerializer, responses={201: s.RelaySessionSerializer})
    @action(detail=True, methods=["post"], throttle_scope="relay")
    def sessions(self, request, pk):
        """Mint single-use tickets opening the desktop's screen and terminal relays, in one mode."""
        desktop = self._desktop(pk)
        mode = self.valid(s.RelaySessionRequestSerializer, request.data)["mode"]
        # A ticket minted from a browser session opens a relay from that session only.
        session_key = "" if self.actor.api_key else request.session.session_key
        tickets = relay_tickets_mint(
            actor=self.actor, desktop_id=desktop.id, mode=mode, session_key=session_key
        )
        return Response(
            s.RelaySessionSerializer(tickets, context={"desktop_id": desktop.id}).data, status=201
        )

    @extend_schema(
        methods=["GET"],
        parameters=[s.FilePathQuery],
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, 413: TOO_LARGE},
    )
    @extend_schema(
        methods=["PUT"],
        parameters=[s.FilePathQuery],
        request={"application/octet-stream": OpenApiTypes.BINARY},
        responses={201: s.FileWrittenSerializer, 413: TOO_LARGE},
    )
    @action(detail=True, methods=["get", "put"])
    def files(self, request, pk):
        """GET a file of the desktop (`?path=` in the agent's home), or a folder as a zip; PUT the request's
        body as a file there, its folders made as needed. Needs the role that may take control."""
        path = self.query(s.FilePathQuery)["path"]
        if request.method == "PUT":
            length = request.headers.get("Content-Length")
            written = files.desktop_file_upload(
                actor=self.actor,
                desktop_id=pk,
                path=path,
                length=int(length) if length and length.isdigit() else None,
                chunks=iter(lambda: request.read(files.CHUNK), b""),
            )
            return Response(s.FileWrittenSerializer({"path": written}).data, status=status.HTTP_201_CREATED)
        download = files.desktop_file_download(actor=self.actor, desktop_id=pk, path=path)
        response = StreamingHttpResponse(streamed(download.chunks), content_type=download.content_type)
        response["Content-Disposition"] = content_disposition_header(True, download.name)
        if download.size is not None:
            response["Content-Length"] = str(download.size)
        return response

    @extend_schema(responses=s.ChatMessageSerializer)
    @action(detail=True, methods=["get"], url_path=r"chat/(?P<message_id>msg_[a-z0-9]+)")
    def chat_message(self, request, pk, message_id):
        """One message; its content grows while the agent answers (poll it until its status is done)."""
        message = selectors.chat_message_get(desktop=self._desktop(pk), message_id=message_id)
        return Response(s.ChatMessageSerializer(message).data)

    @extend_schema(request=None, responses={200: s.ChatMessageSerializer, 409: NOT_NOW})
    @action(detail=True, methods=["post"], url_path=r"chat/(?P<message_id>msg_[a-z0-9]+)/cancel")
    def chat_cancel(self, request, pk, message_id):
        """Cancel a turn (by the operator's message or the agent's reply): a queued one never starts, a
        running one is stopped in the desktop, its processes with it. Needs the role that may take control."""
        reply = chat.chat_cancel(actor=self.actor, desktop=self._desktop(pk), message_id=message_id)
        return Response(s.ChatMessageSerializer(reply).data)

    # Fleets: many desktops in one call, within one workspace (desktops.bulk), and their labels.

    @extend_schema(
        request=s.BulkCreateSerializer,
        responses={
            201: s.BulkCreatedSerializer,
            409: OpenApiResponse(
                description=_("Past a quota of the workspace's tier (code quota_exceeded): none made")
            ),
        },
    )
    @action(detail=False, methods=["post"])
    def bulk(self, request):
        """Make many desktops at once, all of them or none (the quota counts the whole batch)."""
        data = self.valid(s.BulkCreateSerializer, request.data)
        workspace = self.workspace(data.get("workspace_id"), minimum=Role.MEMBER)
        names = data.get("names") or bulk.bulk_names(
            workspace=workspace, prefix=data["name_prefix"], count=data["count"]
        )
        desktops = bulk.desktops_create(
            actor=self.actor,
            workspace=workspace,
            plan=selectors.plan_get(plan=data.get("plan")),
            names=names,
            image_profile=data.get("image_profile", ""),
            labels=data.get("labels", ()),
        )
        return Response(s.BulkCreatedSerializer({"desktops": desktops}).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        operation_id="desktops_bulk_act",
        request=s.BulkSelectionSerializer,
        parameters=[OpenApiParameter("step", OpenApiTypes.STR, OpenApiParameter.PATH, enum=BULK_STEPS)],
        responses=s.BulkResultSerializer,
    )
    @action(detail=False, methods=["post"], url_path=rf"bulk/(?P<step>{'|'.join(BULK_STEPS)})")
    def bulk_act(self, request, step):
        """Request a step on each selected desktop; each is answered on its own (one refusal stops none)."""
        data = self.valid(s.BulkSelectionSerializer, request.data)
        workspace = self.workspace(data.get("workspace_id"), minimum=Role.MEMBER)
        outcomes = bulk.desktops_act(
            actor=self.actor, workspace=workspace, action=step, selection=_selection(data)
        )
        return Response(s.BulkResultSerializer(_bulk_result(outcomes)).data)

    @extend_schema(request=s.BulkLabelsSerializer, responses=s.BulkResultSerializer)
    @action(detail=False, methods=["post"], url_path="bulk/labels")
    def bulk_labels(self, request):
        """Add and remove labels on each selected desktop."""
        data = self.valid(s.BulkLabelsSerializer, request.data)
        workspace = self.workspace(data.get("workspace_id"), minimum=Role.MEMBER)
        outcomes = bulk.desktops_relabel(
            actor=self.actor,
            workspace=workspace,
            selection=_selection(data),
            add=data.get("add", ()),
            remove=data.get("remove", ()),
        )
        return Response(s.BulkResultSerializer(_bulk_result(outcomes)).data)

    @extend_schema(request=s.LabelsChangeSerializer, responses=s.DesktopSerializer)
    @action(detail=True, methods=["post"])
    def labels(self, request, pk):
        """Add and remove the desktop's labels."""
        desktop = self._desktop(pk, Role.MEMBER)
        data = self.valid(s.LabelsChangeSerializer, request.data)
        desktops_label(
            actor=self.actor,
            workspace=desktop.workspace,
            desktop_ids=[desktop.id],
            add=data.get("add", ()),
            remove=data.get("remove", ()),
        )
        return Response(s.DesktopSerializer(self._desktop(pk)).data)

    @extend_schema(
        request=s.ExecSerializer,
        responses={
            200: s.ExecResultSerializer,
            409: OpenApiResponse(description=_("The desktop is not running")),
            503: OpenApiResponse(description=_("The desktop's shell is not answering (try again)")),
        },
    )
    @action(detail=True, methods=["post"], url_path="exec", throttle_scope="exec")
    def run_command(self, request, pk):
        """Run a command in the desktop as its agent user, over SSH: its exit code and output (the first
        MiB of each stream), within `timeout` seconds. Needs the role that may take control."""
        desktop = self._desktop(pk)
        selectors.workspace_for_control(
            actor=self.actor, workspace_id=desktop.workspace_id
        )  # before the body
        data = self.valid(s.ExecSerializer, request.data)
        result = desktop_exec(
            actor=self.actor,
            desktop=desktop,
            command=data.get("command") or shlex.join(data["argv"]),
            timeout=data["timeout"],
            stdin=data["stdin"],
        )
        return Response(s.ExecResultSerializer(result).data)

    @extend_schema(
        parameters=[
            s.ScreenshotQuery,
            *(
                OpenApiParameter(name, OpenApiTypes.INT, OpenApiParameter.HEADER, response=[200])
                for name in ("X-Screen-Width", "X-Screen-Height")
            ),
            OpenApiParameter(
                "X-Screenshot-Scale",
                OpenApiTypes.DOUBLE,
                OpenApiParameter.HEADER,
                response=[200],
                description=_("Image pixels per screen pixel"),
            ),
        ],
        responses={
            (200, "image/png"): OpenApiResponse(OpenApiTypes.BINARY, description=SCREENSHOT_HEADERS),
            (200, "image/jpeg"): OpenApiResponse(OpenApiTypes.BINARY, description=SCREENSHOT_HEADERS),
            409: OpenApiResponse(description=_("The desktop is not running")),
            503: SCREEN_DOWN,
        },
    )
    @action(
        detail=True, methods=["get"], content_negotiation_class=ImageNegotiation, throttle_scope="screenshot"
    )
    def screenshot(self, request, pk):
        """The desktop's screen as a PNG or JPEG image, optionally scaled down to a width."""
        desktop = self._desktop(pk)
        query = self.query(s.ScreenshotQuery)
        shot = screen.screen_screenshot(
            desktop=desktop,
            options=screen.ScreenshotOptions(query["format"], query.get("width")),
            caller=self.actor,
        )
        response = HttpResponse(shot.data, content_type=shot.content_type)
        response["Cache-Control"] = "no-store"
        response["X-Screen-Width"], response["X-Screen-Height"] = shot.screen_width, shot.screen_height
        response["X-Screenshot-Scale"] = f"{shot.scale:.6f}"
        return response

    @extend_schema(
        responses={200: s.ScreenSerializer, 409: OpenApiResponse(description=_("The desktop is not running"))}
    )
    @action(detail=True, methods=["get"], url_path="screen", throttle_scope="screenshot")
    def screen_info(self, request, pk):
        """The screen's size, and where its pointer is when the desktop's screen says."""
        info = screen.screen_info(desktop=self._desktop(pk), caller=self.actor)
        return Response(s.ScreenSerializer(info).data)

    @extend_schema(
        request=s.ScreenActionsSerializer,
        responses={
            200: s.ScreenActionsDoneSerializer,
            409: OpenApiResponse(description=_("The desktop is not running")),
            503: SCREEN_DOWN,
        },
    )
    @action(detail=True, methods=["post"], url_path="actions", throttle_scope="actions")
    def screen_actions(self, request, pk):
        """Move, click, drag, scroll, type and press keys on the desktop's screen, in order, then
        optionally take a screenshot once it has settled. The whole batch is checked before any of it
        is done. Needs the role that may take control."""
        desktop = self._desktop(pk)
        selectors.workspace_for_control(
            actor=self.actor, workspace_id=desktop.workspace_id
        )  # before the body
        data = self.valid(s.ScreenActionsSerializer, request.data)
        options = screen.ScreenshotOptions(data["format"], data.get("width")) if data["screenshot"] else None
        done = screen.screen_act(
            actor=self.actor, desktop=desktop, actions=data["actions"], screenshot=options
        )
        return Response(s.ScreenActionsDoneSerializer(done).data)

    @extend_schema(methods=["GET"], responses=s.ScheduleSerializer(many=True))
    @extend_schema(methods=["POST"], request=s.ScheduleWriteSerializer, responses={201: s.ScheduleSerializer})
    @action(detail=True, methods=["get", "post"])
    def schedules(self, request, pk):
        """Messages sent to the desktop's agent on a cron schedule (started first if need be)."""
        desktop = self._desktop(pk)
        if request.method == "GET":
            page = self.paginate_queryset(selectors.schedule_list(desktop=desktop))
            return self.get_paginated_response(_schedules_data(page))
        selectors.workspace_for_control(
            actor=self.actor, workspace_id=desktop.workspace_id
        )  # before the body
        data = self.valid(s.ScheduleWriteSerializer, request.data)
        schedule = schedules.schedule_create(
            actor=self.actor,
            desktop=desktop,
            cron=data["cron"],
            message=data["message"],
            tz=data["timezone"],
            stop_after=data["stop_after"],
            enabled=data["enabled"],
        )
        return Response(_schedules_data([schedule])[0], status=status.HTTP_201_CREATED)

    @extend_schema(methods=["GET"], request=None, responses=s.EgressSerializer)
    @extend_schema(methods=["PUT"], request=s.EgressWriteSerializer, responses=s.EgressSerializer)
    @extend_schema(methods=["DELETE"], request=None, responses={200: s.EgressSerializer})
    @action(detail=True, methods=["get", "put", "delete"])
    def egress(self, request, pk):
        """Where the desktop may connect. PUT gives it a policy of its own (admins); DELETE drops it, and
        the desktop follows its workspace's again. Running desktops follow a change within seconds."""
        if request.method == "GET":
            return Response(s.EgressSerializer(egress.egress_of_desktop(desktop=self._desktop(pk))).data)
        self._desktop(pk, Role.ADMIN)  # before the body
        if request.method == "DELETE":
            policy = egress.desktop_egress_inherit(actor=self.actor, desktop_id=pk)
        else:
            policy = egress.desktop_egress_set(
                actor=self.actor, desktop_id=pk, **self.valid(s.EgressWriteSerializer, request.data)
            )
        return Response(s.EgressSerializer(policy).data)

    @extend_schema(responses=s.BlockedAttemptSerializer(many=True))
    @action(detail=True, methods=["get"])
    def blocked(self, request, pk):
        """What the desktop tried to reach and its egress policy refused, per destination, the latest
        attempt first, with how many attempts were counted (read from its engine every half-minute)."""
        return self.page(blocked_attempts_of(desktop=self._desktop(pk)), s.BlockedAttemptSerializer)

    def _desktop(self, pk, minimum=Role.VIEWER):
        return selectors.desktop_get(actor=self.actor, desktop_id=pk, minimum=minimum)

    def _act(self, pk, step):
        desktop = services.desktop_act(actor=self.actor, desktop=self._desktop(pk, Role.MEMBER), action=step)
        return Response(s.DesktopSerializer(desktop).data, status=status.HTTP_202_ACCEPTED)


def _selection(data) -> bulk.Selection:
    return bulk.Selection(
        ids=tuple(data.get("ids", ())),
        labels=tuple(data.get("labels", ())),
        state=data.get("state", ""),
        everything=data["all"],
    )


def _bulk_result(outcomes: list[bulk.Outcome]) -> dict:
    done = sum(outcome.ok for outcome in outcomes)
    return {"done": done, "refused": len(outcomes) - done, "results": outcomes}


def _schedules_data(page) -> list[dict]:
    last_runs = selectors.schedule_last_runs(schedule_ids=[schedule.id for schedule in page])
    return s.ScheduleSerializer(page, many=True, context={"last_runs": last_runs}).data


class ScheduleViewSet(ApiViewSet):
    """A desktop's scheduled messages (create them at /api/desktops/{id}/schedules)."""

    serializer_class = s.ScheduleSerializer

    def retrieve(self, request, pk):
        return Response(_schedules_data([self._schedule(pk)])[0])

    @extend_schema(request=s.ScheduleUpdateSerializer)
    def partial_update(self, request, pk):
        """Change it; it then sends its messages as you."""
        schedule = self._schedule(pk)
        selectors.workspace_for_control(
            actor=self.actor, workspace_id=schedule.workspace_id
        )  # before the body
        data = self.valid(s.ScheduleUpdateSerializer, request.data)
        schedule = schedules.schedule_update(actor=self.actor, schedule=schedule, **data)
        return Response(_schedules_data([schedule])[0])

    @extend_schema(responses={204: None})
    def destroy(self, request, pk):
        schedules.schedule_delete(actor=self.actor, schedule=self._schedule(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=s.ScheduleRunSerializer(many=True))
    @action(detail=True, methods=["get"])
    def runs(self, request, pk):
        """The times it came due, newest first: what each did, and the answer it got."""
        return self.page(selectors.schedule_runs(schedule=self._schedule(pk)), s.ScheduleRunSerializer)

    def _schedule(self, pk):
        return selectors.schedule_get(actor=self.actor, schedule_id=pk)


class PlanViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ApiViewSet):
    serializer_class = s.PlanSerializer
    queryset = selectors.plan_list()


class TierViewSet(mixins.ListModelMixin, ApiViewSet):
    """The tiers a workspace can be on, with their quotas and monthly price."""

    serializer_class = s.TierSerializer
    queryset = tier_list()


class WorkspaceViewSet(ApiViewSet):
    serializer_class = s.WorkspaceSerializer

    def list(self, request):
        return self.page(selectors.workspaces_visible(actor=self.actor), s.WorkspaceSerializer)

    def create(self, request):
        if self.actor.api_key is not None:
            raise Forbidden("An API key belongs to one workspace; create workspaces from Mission Control.")
        data = self.valid(s.WorkspaceSerializer, request.data)
        workspace = services.workspace_create(user=request.user, name=data["name"])
        return Response(s.WorkspaceSerializer(workspace).data, status=status.HTTP_201_CREATED)

    def retrieve(self, request, pk):
        return Response(s.WorkspaceSerializer(self.workspace(pk)).data)

    @extend_schema(request=s.WorkspaceUpdateSerializer)
    def partial_update(self, request, pk):
        workspace = self.workspace(pk, minimum=Role.ADMIN)
        data = self.valid(s.WorkspaceUpdateSerializer, request.data)
        with transaction.atomic():  # every change or none
            if "name" in data:
                workspace = services.workspace_rename(actor=self.actor, workspace_id=pk, name=data["name"])
            if "agent_command" in data:
                workspace = services.workspace_agent_command_set(
                    actor=self.actor, workspace_id=pk, command=data["agent_command"]
                )
            if "control_role" in data:
                workspace = services.workspace_control_role_set(
                    actor=self.actor, workspace_id=pk, role=data["control_role"]
                )
            if {"approval_role", "approval_timeout", "approval_commands"} & data.keys():
                workspace = approvals.approval_policy_set(
                    actor=self.actor,
                    workspace_id=pk,
                    role=data.get("approval_role"),
                    timeout=data.get("approval_timeout"),
                    commands=data.get("approval_commands"),
                )
            if "alert_thresholds" in data:
                workspace = alerts.alert_thresholds_set(
                    actor=self.actor, workspace_id=pk, thresholds=data["alert_thresholds"]
                )
        return Response(s.WorkspaceSerializer(workspace).data)

    @extend_schema(responses={204: None, 409: NOT_NOW})
    def destroy(self, request, pk):
        self.workspace(pk)
        services.workspace_delete(actor=self.actor, workspace_id=pk)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=s.WorkspaceUsageSerializer)
    @action(detail=True, methods=["get"])
    def usage(self, request, pk):
        """The workspace's agents' model usage: the total and each desktop's."""
        total, per_desktop = agent_usage_of_workspace(self.workspace(pk))
        desktops = [{"desktop_id": i, "name": n, **vars(u)} for i, n, u in per_desktop]
        return Response(s.WorkspaceUsageSerializer({"total": total, "desktops": desktops}).data)

    @extend_schema(parameters=[s.CostsQuery], responses=s.MonthCostsSerializer)
    @action(detail=True, methods=["get"])
    def costs(self, request, pk):
        """The month's usage and costs (`?month=YYYY-MM`, this one by default): per day, per desktop, owed."""
        month = self.valid(s.CostsQuery, request.query_params).get("month") or this_month()
        costs = costs_of_workspace(actor=self.actor, workspace_id=self.workspace(pk).id, month=month)
        return Response(s.MonthCostsSerializer(costs).data)

    @extend_schema(responses=s.QuotaUsageSerializer)
    @action(detail=True, methods=["get"])
    def quota(self, request, pk):
        """The workspace's tier, and what it uses of each of its quotas now."""
        usage = quota_of(actor=self.actor, workspace_id=self.workspace(pk).id)
        return Response(s.QuotaUsageSerializer(usage).data)

    @extend_schema(methods=["GET"], responses=s.ModelPriceSerializer(many=True))
    @extend_schema(methods=["POST"], request=s.ModelPriceWriteSerializer, responses=s.ModelPriceSerializer)
    @action(detail=True, methods=["get", "post"], url_path="model-prices")
    def model_prices(self, request, pk):
        """What each model's tokens cost the workspace; POST sets one model's price (new or changed)."""
        workspace = self.workspace(pk)
        if request.method == "GET":
            return self.page(model_price_list(workspace=workspace), s.ModelPriceSerializer)
        data = self.valid(s.ModelPriceWriteSerializer, request.data)
        price = billing.model_price_set(actor=self.actor, workspace_id=workspace.id, **data)
        return Response(s.ModelPriceSerializer(price).data)

    @extend_schema(request=None, responses={204: None})
    @action(detail=True, methods=["delete"], url_path=r"model-prices/(?P<price_id>mpr_[a-z0-9]+)")
    def model_price(self, request, pk, price_id):
        billing.model_price_delete(actor=self.actor, workspace_id=self.workspace(pk).id, price_id=price_id)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(methods=["GET"], request=None, responses=s.EgressSerializer)
    @extend_schema(methods=["PUT"], request=s.EgressWriteSerializer, responses=s.EgressSerializer)
    @action(detail=True, methods=["get", "put"])
    def egress(self, request, pk):
        """Where the workspace's desktops may connect, but those with a policy of their own. PUT (admins)
        applies to running desktops within seconds."""
        if request.method == "GET":
            return Response(s.EgressSerializer(egress.egress_of_workspace(workspace=self.workspace(pk))).data)
        self.workspace(pk, minimum=Role.ADMIN)  # before the body
        policy = egress.workspace_egress_set(
            actor=self.actor, workspace_id=pk, **self.valid(s.EgressWriteSerializer, request.data)
        )
        return Response(s.EgressSerializer(policy).data)

    @extend_schema(methods=["GET"], responses=s.WebhookSerializer)
    @extend_schema(methods=["PUT"], request=s.WebhookSetSerializer, responses=s.WebhookSerializer)
    @action(detail=True, methods=["get", "put"])
    def webhook(self, request, pk):
        """Where the workspace's requests for approval and their answers are POSTed, signed (admins). The
        signing secret is shown once: when the first URL is set, or when `rotateSecret` asks for a new one."""
        workspace, secret = self.workspace(pk, minimum=Role.ADMIN), ""
        if request.method == "PUT":
            data = self.valid(s.WebhookSetSerializer, request.data)
            workspace, secret = webhooks.webhook_set(
                actor=self.actor, workspace_id=pk, url=data["url"], rotate_secret=data["rotate_secret"]
            )
        return Response(s.WebhookSerializer({"url": workspace.approval_webhook_url, "secret": secret}).data)

    @extend_schema(responses=s.WebhookDeliverySerializer(many=True))
    @action(detail=True, methods=["get"], url_path="webhook/deliveries")
    def webhook_deliveries(self, request, pk):
        """What was sent to the webhook, newest first, and how each delivery went (admins)."""
        deliveries = webhooks.webhook_deliveries(actor=self.actor, workspace_id=pk)
        return self.page(deliveries, s.WebhookDeliverySerializer)

    @extend_schema(responses=s.LabelCountSerializer(many=True))
    @action(detail=True, methods=["get"])
    def labels(self, request, pk):
        """The labels on the workspace's desktops, with how many desktops have each."""
        return self.page(selectors.label_list(workspace=self.workspace(pk)), s.LabelCountSerializer)

    @extend_schema(responses=s.MembershipSerializer(many=True))
    @action(detail=True, methods=["get"])
    def members(self, request, pk):
        return self.page(selectors.membership_list(workspace=self.workspace(pk)), s.MembershipSerializer)

    @extend_schema(methods=["GET"], responses=s.InvitationSerializer(many=True))
    @extend_schema(
        methods=["POST"],
        request=s.InvitationCreateSerializer,
        responses={201: s.InvitationSerializer, 409: NOT_NOW},
    )
    @action(detail=True, methods=["get", "post"], throttle_scope="invitations", throttle_writes_only=True)
    def invitations(self, request, pk):
        """Invite someone by e-mail; they join once they accept from that address, confirmed."""
        workspace = self.workspace(pk, minimum=Role.ADMIN)
        if request.method == "GET":
            return self.page(selectors.invitations_pending(workspace=workspace), s.InvitationSerializer)
        data = self.valid(s.InvitationCreateSerializer, request.data)
        invitation = services.member_invite(actor=self.actor, workspace_id=workspace.id, **data)
        return Response(s.InvitationSerializer(invitation).data, status=status.HTTP_201_CREATED)

    @action(detail=True, methods=["delete"], url_path=r"invitations/(?P<invitation_id>inv_[a-z0-9]+)")
    def invitation(self, request, pk, invitation_id):
        workspace = self.workspace(pk, minimum=Role.ADMIN)
        services.invitation_revoke(actor=self.actor, workspace_id=workspace.id, invitation_id=invitation_id)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        methods=["PATCH"],
        request=s.MembershipUpdateSerializer,
        responses={200: s.MembershipSerializer, 409: NOT_NOW},
    )
    @extend_schema(methods=["DELETE"], responses={204: None, 409: NOT_NOW})
    @action(detail=True, methods=["patch", "delete"], url_path=r"members/(?P<membership_id>mem_[a-z0-9]+)")
    def member(self, request, pk, membership_id):
        self.workspace(pk)
        if request.method == "DELETE":
            services.membership_remove(actor=self.actor, workspace_id=pk, membership_id=membership_id)
            return Response(status=status.HTTP_204_NO_CONTENT)
        data = self.valid(s.MembershipUpdateSerializer, request.data)
        membership = services.membership_set_role(
            actor=self.actor, workspace_id=pk, membership_id=membership_id, role=data["role"]
        )
        return Response(s.MembershipSerializer(membership).data)


class InvitationViewSet(ApiViewSet):
    """Invitations to the signed-in person's confirmed addresses, which only they can answer."""

    serializer_class = s.InvitationSerializer

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        if self.actor.api_key is not None:
            raise Forbidden(
                _("An API key acts in its workspace only: answer invitations from Mission Control.")
            )

    def list(self, request):
        return self.page(selectors.invitations_for(user=request.user), s.InvitationSerializer)

    @extend_schema(request=None, responses={200: s.MembershipSerializer})
    @action(detail=True, methods=["post"])
    def accept(self, request, pk):
        membership = services.invitation_answer(user=request.user, invitation_id=pk, accept=True)
        return Response(s.MembershipSerializer(membership).data)

    @extend_schema(request=None, responses={204: None})
    @action(detail=True, methods=["post"])
    def decline(self, request, pk):
        services.invitation_answer(user=request.user, invitation_id=pk, accept=False)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ApiKeyViewSet(ApiViewSet):
    serializer_class = s.ApiKeySerializer

    @extend_schema(parameters=[WorkspaceQuery])
    def list(self, request):
        return self.page(
            selectors.api_key_list(actor=self.actor, workspace_id=self.managed()), s.ApiKeySerializer
        )

    @extend_schema(request=s.ApiKeyCreateSerializer, responses={201: s.ApiKeyCreatedSerializer})
    def create(self, request):
        data = self.valid(s.ApiKeyCreateSerializer, request.data)
        workspace = self.workspace(data.pop("workspace_id", None), minimum=Role.ADMIN)
        key, token = services.api_key_create(actor=self.actor, workspace_id=workspace.id, **data)
        key.key = token
        return Response(s.ApiKeyCreatedSerializer(key).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk):
        key = selectors.api_key_get(actor=self.actor, key_id=pk)
        services.api_key_revoke(actor=self.actor, workspace_id=key.workspace_id, key_id=key.id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class LLMKeyViewSet(ApiViewSet):
    serializer_class = s.LLMKeySerializer

    @extend_schema(parameters=[WorkspaceQuery])
    def list(self, request):
        return self.page(
            selectors.llm_key_list(actor=self.actor, workspace_id=self.managed()), s.LLMKeySerializer
        )

    def retrieve(self, request, pk):
        return Response(s.LLMKeySerializer(self._key(pk)).data)

    @extend_schema(request=s.LLMKeyWriteSerializer, responses={201: s.LLMKeySerializer})
    def create(self, request):
        data = self.valid(s.LLMKeyWriteSerializer, request.data)
        workspace = self.workspace(data.pop("workspace_id", None), minimum=Role.ADMIN)
        key = services.llm_key_save(actor=self.actor, workspace_id=workspace.id, **data)
        return Response(s.LLMKeySerializer(key).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.LLMKeyWriteSerializer, responses=s.LLMKeySerializer)
    def update(self, request, pk):
        """Rotate: replace the secret (and optionally the name or base URL)."""
        key = self._key(pk)
        data = self.valid(s.LLMKeyWriteSerializer, request.data)
        data.pop("workspace_id", None)
        key = services.llm_key_save(actor=self.actor, workspace_id=key.workspace_id, key=key, **data)
        return Response(s.LLMKeySerializer(key).data)

    def destroy(self, request, pk):
        key = self._key(pk)
        services.llm_key_delete(actor=self.actor, workspace_id=key.workspace_id, key_id=key.id)
        return Response(status=status.HTTP_204_NO_CONTENT)

    def _key(self, pk):
        return selectors.llm_key_get(actor=self.actor, key_id=pk)


class AuditQuery(serializers.Serializer):
    workspace = serializers.CharField(required=False)
    actor = serializers.CharField(required=False)
    action = serializers.CharField(required=False)
    target = serializers.CharField(required=False)
    since = serializers.DateTimeField(required=False)
    until = serializers.DateTimeField(required=False)


class AuditViewSet(ApiViewSet):
    serializer_class = s.AuditEventSerializer

    @extend_schema(parameters=[AuditQuery])
    def list(self, request):
        query = self.query(AuditQuery)
        workspace = self.workspace(query.pop("workspace", None), minimum=Role.ADMIN)
        return self.page(selectors.audit_list(workspace=workspace, **query), s.AuditEventSerializer)


class ApprovalViewSet(ApiViewSet):
    """Agents' requests for approval, asked from inside their desktops (`bureau approve`)."""

    serializer_class = s.ApprovalSerializer

    @extend_schema(parameters=[s.ApprovalQuery])
    def list(self, request):
        """The requests of your workspaces, newest first; `?status=pending` is the queue to answer."""
        query = self.query(s.ApprovalQuery)
        found = approvals.approval_list(
            actor=self.actor,
            workspace_id=query.get("workspace"),
            desktop_id=query.get("desktop"),
            status=query.get("status"),
        )
        return self.page(found, s.ApprovalSerializer)

    def retrieve(self, request, pk):
        return Response(s.ApprovalSerializer(approvals.approval_get(actor=self.actor, approval_id=pk)).data)

    @extend_schema(responses={(200, "image/jpeg"): OpenApiTypes.BINARY})
    @action(detail=True, methods=["get"])
    def screenshot(self, request, pk):
        """The asking desktop's screen, taken moments after it asked (404 when none could be taken)."""
        shot = approvals.approval_screenshot_get(actor=self.actor, approval_id=pk)
        return HttpResponse(bytes(shot.image), content_type=shot.content_type)

    @extend_schema(request=s.ApprovalDecisionSerializer, responses={200: s.ApprovalSerializer, 409: NOT_NOW})
    @action(detail=True, methods=["post"])
    def approve(self, request, pk):
        """Approve the request, with an optional comment the agent reads; the first answer stands."""
        return self._decide(pk, approve=True)

    @extend_schema(request=s.ApprovalDecisionSerializer, responses={200: s.ApprovalSerializer, 409: NOT_NOW})
    @action(detail=True, methods=["post"])
    def deny(self, request, pk):
        """Deny the request, with an optional comment the agent reads (why, what to do instead)."""
        return self._decide(pk, approve=False)

    def _decide(self, pk, *, approve: bool):
        approvals.approval_get(actor=self.actor, approval_id=pk)  # who may see it, before the body
        comment = self.valid(s.ApprovalDecisionSerializer, self.request.data)["comment"]
        approval = approvals.approval_decide(
            actor=self.actor, approval_id=pk, approve=approve, comment=comment
        )
        return Response(s.ApprovalSerializer(approval).data)


class AlertViewSet(ApiViewSet):
    """What the alert rules found on your desktops: raised, shown, told, and acknowledged by a person."""

    serializer_class = s.AlertSerializer

    @extend_schema(parameters=[s.AlertQuery])
    def list(self, request):
        """The alerts of your workspaces, newest first; `?status=open` is what nobody has seen to yet."""
        query = self.query(s.AlertQuery)
        found = alerts.alert_list(
            actor=self.actor,
            workspace_id=query.get("workspace"),
            desktop_id=query.get("desktop"),
            status=query.get("status"),
            kind=query.get("kind"),
        )
        return self.page(found, s.AlertSerializer)

    def retrieve(self, request, pk):
        return Response(s.AlertSerializer(alerts.alert_get(actor=self.actor, alert_id=pk)).data)

    @extend_schema(request=None, responses={200: s.AlertSerializer, 409: NOT_NOW})
    @action(detail=True, methods=["post"])
    def acknowledge(self, request, pk):
        """Say you have seen to the alert (the role that may take control of desktops); once."""
        return Response(s.AlertSerializer(alerts.alert_acknowledge(actor=self.actor, alert_id=pk)).data)
