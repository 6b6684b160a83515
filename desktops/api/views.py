"""Thin views: parse input, call a selector or a service, shape the output."""

from django.db import transaction
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
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
from desktops import selectors, services
from desktops.api import serializers as s
from desktops.audit import Actor, audit_record
from desktops.errors import Forbidden
from desktops.models import DesktopState, Role
from proxies.sessions import relay_session_create


class WorkspaceQuery(serializers.Serializer):
    workspace = serializers.CharField(required=False, help_text="Workspace id (ws_…)")


class ApiViewSet(viewsets.GenericViewSet):
    """Base of every endpoint: knows its actor and writes one audit event per request."""

    audit_workspace_id = ""

    @property
    def actor(self) -> Actor:
        return Actor.from_request(self.request)

    def workspace(self, workspace_id: str | None, minimum: Role = Role.VIEWER):
        if workspace_id:
            workspace = selectors.workspace_get(actor=self.actor, workspace_id=workspace_id, minimum=minimum)
        else:
            workspace = selectors.workspace_default(actor=self.actor)
            selectors.workspace_get(actor=self.actor, workspace_id=workspace.id, minimum=minimum)
        self.audit_workspace_id = workspace.id
        return workspace

    def managed(self) -> str | None:
        """The `?workspace=` a key list is narrowed to, once the actor is known to manage it."""
        workspace_id = self.valid(WorkspaceQuery, self.request.query_params).get("workspace")
        return workspace_id and self.workspace(workspace_id, minimum=Role.ADMIN).id

    def scoped(self, found):
        """Remember whose object this request touched, for the audit trail."""
        self.audit_workspace_id = found.workspace_id
        return found

    def valid(self, serializer_class, data):
        serializer = serializer_class(data=data)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data

    def page(self, queryset, serializer_class):
        page = self.paginate_queryset(queryset)
        return self.get_paginated_response(serializer_class(page, many=True).data)

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        actor = Actor.from_request(request)
        audit_record(
            actor=actor,
            action="api.request",
            workspace_id=self.audit_workspace_id or (actor.api_key.workspace_id if actor.api_key else ""),
            target=request.path,
            method=request.method,
            status=response.status_code,
        )
        return response


class DesktopListQuery(serializers.Serializer):
    state = serializers.ChoiceField(choices=DesktopState.choices, required=False)
    workspace = serializers.CharField(required=False, help_text="Workspace id (ws_…)")


class DesktopViewSet(ApiViewSet):
    serializer_class = s.DesktopSerializer

    @extend_schema(parameters=[DesktopListQuery])
    def list(self, request):
        query = self.valid(DesktopListQuery, request.query_params)
        if query.get("workspace"):
            self.workspace(query["workspace"])
        desktops = selectors.desktop_list(
            actor=self.actor, workspace_id=query.get("workspace"), state=query.get("state")
        )
        return self.page(desktops, s.DesktopSerializer)

    @extend_schema(
        request=s.DesktopCreateSerializer,
        responses={
            201: s.DesktopSerializer,
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
        )
        headers = {"Location": f"/api/desktops/{desktop.id}"}
        return Response(s.DesktopSerializer(desktop).data, status=status.HTTP_201_CREATED, headers=headers)

    def retrieve(self, request, pk):
        return Response(s.DesktopSerializer(self._desktop(pk)).data)

    @extend_schema(responses={202: s.DesktopSerializer})
    def destroy(self, request, pk):
        return self._act(pk, "destroy")

    @extend_schema(
        operation_id="desktops_act",
        request=None,
        responses={
            202: s.DesktopSerializer,
            409: OpenApiResponse(
                description="Not allowed in the current state, or past a quota of the workspace's tier"
            ),
        },
    )
    @action(detail=True, methods=["post"], url_path=r"(?P<step>start|stop|suspend|resume)")
    def act(self, request, pk, step):
        return self._act(pk, step)

    @extend_schema(responses=s.DesktopEventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request, pk):
        return self.page(selectors.desktop_events(desktop=self._desktop(pk)), s.DesktopEventSerializer)

    @extend_schema(
        request=s.ChatSendSerializer,
        responses={200: s.ChatMessageSerializer(many=True), 202: s.ChatMessageSerializer},
    )
    @action(detail=True, methods=["get", "post"])
    def chat(self, request, pk):
        """The conversation with the desktop's agent; POST a message, the answer arrives in it."""
        if request.method == "GET":
            return self.page(selectors.chat_list(desktop=self._desktop(pk)), s.ChatMessageSerializer)
        message = self.valid(s.ChatSendSerializer, request.data)["message"]
        reply = services.chat_send(actor=self.actor, desktop=self._desktop(pk, Role.MEMBER), message=message)
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
    @action(detail=True, methods=["post"])
    def sessions(self, request, pk):
        """Mint a short-lived token opening the desktop's VNC and terminal relays."""
        mode = self.valid(s.RelaySessionRequestSerializer, request.data)["mode"]
        session = relay_session_create(actor=self.actor, desktop_id=self._desktop(pk).id, mode=mode)
        return Response(s.RelaySessionSerializer(session, context={"desktop_id": pk}).data, status=201)

    def _desktop(self, pk, minimum=Role.VIEWER):
        return self.scoped(selectors.desktop_get(actor=self.actor, desktop_id=pk, minimum=minimum))

    def _act(self, pk, step):
        desktop = services.desktop_act(actor=self.actor, desktop=self._desktop(pk, Role.MEMBER), action=step)
        return Response(s.DesktopSerializer(desktop).data, status=status.HTTP_202_ACCEPTED)


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
        self.audit_workspace_id = workspace.id
        return Response(s.WorkspaceSerializer(workspace).data, status=status.HTTP_201_CREATED)

    def retrieve(self, request, pk):
        return Response(s.WorkspaceSerializer(self.workspace(pk)).data)

    @extend_schema(request=s.WorkspaceUpdateSerializer)
    def partial_update(self, request, pk):
        data = self.valid(s.WorkspaceUpdateSerializer, request.data)
        workspace = self.workspace(pk)
        with transaction.atomic():  # both changes or neither
            if "name" in data:
                workspace = services.workspace_rename(actor=self.actor, workspace_id=pk, name=data["name"])
            if "agent_command" in data:
                workspace = services.workspace_agent_command_set(
                    actor=self.actor, workspace_id=pk, command=data["agent_command"]
                )
        return Response(s.WorkspaceSerializer(workspace).data)

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

    @extend_schema(request=s.ModelPriceWriteSerializer, responses=s.ModelPriceSerializer(many=True))
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

    @extend_schema(request=s.MembershipCreateSerializer, responses=s.MembershipSerializer(many=True))
    @action(detail=True, methods=["get", "post"])
    def members(self, request, pk):
        workspace = self.workspace(pk)
        if request.method == "GET":
            return self.page(selectors.membership_list(workspace=workspace), s.MembershipSerializer)
        data = self.valid(s.MembershipCreateSerializer, request.data)
        membership = services.membership_add(actor=self.actor, workspace_id=pk, **data)
        return Response(s.MembershipSerializer(membership).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.MembershipUpdateSerializer, responses=s.MembershipSerializer)
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
        key = self.scoped(selectors.api_key_get(actor=self.actor, key_id=pk))
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
        return self.scoped(selectors.llm_key_get(actor=self.actor, key_id=pk))


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
        query = self.valid(AuditQuery, request.query_params)
        workspace = self.workspace(query.pop("workspace", None), minimum=Role.ADMIN)
        return self.page(selectors.audit_list(workspace=workspace, **query), s.AuditEventSerializer)
