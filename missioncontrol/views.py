"""Mission Control pages. Every action goes through the same services as the REST API."""

from __future__ import annotations

import csv
import re
from datetime import datetime, time, timedelta
from decimal import Decimal
from functools import wraps
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connection, transaction
from django.http import Http404, HttpResponse, HttpResponseForbidden, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy as _lazy
from django.utils.translation import ngettext
from django.views.decorators.http import require_POST
from django_eventstream.views import events as eventstream_events

from billing import services as billing
from billing.metering import month_of, month_parse, next_month, this_month
from billing.money import euros
from billing.selectors import (
    agent_model,
    agent_usage_of_desktop,
    agent_usage_of_workspace,
    confirmation_awaited,
    costs_of_desktop,
    costs_of_workspace,
    fleet_spend_shown,
    model_price_list,
    plan_prices,
    quota_of,
    spend_alerts_this_month,
    tier_list,
)
from desktops import alerts, approvals, egress, schedules, selectors, services, webhooks
from desktops.agent_failures import failure_of
from desktops.audit import Actor
from desktops.engines import desktop_blocked_egress, desktop_resource_usage
from desktops.errors import DomainError, Forbidden, Invalid, NotFound
from desktops.events import workspace_stream
from desktops.labels import desktops_label
from desktops.lifecycle import TRANSITIONS
from desktops.models import DesktopState, Role
from desktops.relays import desktop_watchers
from desktops.selectors import role_in
from missioncontrol import forms
from missioncontrol.accounts import invitation_link_remember
from missioncontrol.audit_actions import ACTIONS, action_words
from missioncontrol.charts import bar_chart
from missioncontrol.exports import safe_cell
from missioncontrol.streams import watched

LIVE_STATES = {DesktopState.RUNNING}
PAGE_SIZE = 50


def workspace_page(minimum: Role = Role.VIEWER):
    """The view gets the workspace of the URL; outsiders get a 404, lower roles a 403."""

    def decorate(view):
        @login_required
        @wraps(view)
        def wrapper(request, workspace_id, *args, **kwargs):
            actor = Actor.from_request(request)
            try:
                workspace = selectors.workspace_get(actor=actor, workspace_id=workspace_id, minimum=minimum)
            except NotFound as exc:
                raise Http404(exc.message) from exc
            except Forbidden as exc:
                raise PermissionDenied(exc.message) from exc
            if request.session.get("workspace") != workspace.id:  # else a session write on every page
                request.session["workspace"] = workspace.id
            request.actor, request.workspace, request.role = actor, workspace, workspace.role
            return view(request, *args, **kwargs)

        return wrapper

    return decorate


def page(request, template: str, **context):
    return render(
        request,
        template,
        {
            "workspace": request.workspace,
            "workspaces": selectors.workspaces_visible(actor=request.actor),
            "role": request.role,
            "can_act": request.role.rank >= Role.MEMBER.rank,
            "can_manage": request.role.rank >= Role.ADMIN.rank,
            "approvals_waiting": approvals.approvals_waiting_count(workspace_id=request.workspace.id),
            "alerts_open": alerts.alerts_open_count(workspace_id=request.workspace.id),
            "invitations_waiting": selectors.invitations_for(user=request.user).count(),
            **context,
        },
    )


def query_without_page(request) -> str:
    """The page's filters, for links to its other pages."""
    query = request.GET.copy()
    query.pop("page", None)
    return query.urlencode()


def attempt(request, call, success: str = "") -> bool:
    """Run a service call; its refusal becomes a message on the page, never a half-done change."""
    try:
        call()
    except DomainError as exc:
        messages.error(request, exc.message)
        return False
    if success:
        messages.success(request, success)
    return True


def refused_onto(form, exc: DomainError) -> None:
    """A service's refusal of what was typed, beside the fields it names (by their names in the API,
    camelCase, or the model's); what names no field of the form goes above it. A refusal about one
    field is said whole beside it (its message says more than the field's short word)."""
    named = {
        re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower(): errors for name, errors in (exc.fields or {}).items()
    }
    named = {field: errors for field, errors in named.items() if field in form.fields}
    if len(named) == 1:
        named = {field: [exc.message] for field in named}
    for field, errors in named.items():
        for error in errors:
            form.add_error(field, error)
    if not named:
        form.add_error(None, exc.message)


def home(request):
    """Signed out: what Le Bureau is, and the way in. Signed in: one's desktops."""
    if not request.user.is_authenticated:
        return render(request, "missioncontrol/landing.html")
    workspaces = selectors.workspaces_visible(actor=Actor.from_request(request))
    # Invitations waiting for an answer come first: accepting or declining is one click. Someone
    # with no workspace yet whose invitation waits for them to confirm the address is told so, rather
    # than handed an empty workspace of their own.
    if selectors.invitations_for(user=request.user).exists() or (
        not workspaces.exists() and selectors.invitations_unconfirmed(user=request.user)
    ):
        return redirect("invitations")
    current = workspaces.filter(id=request.session.get("workspace")).first() or workspaces.first()
    if current is None:
        current = services.workspace_ensure_for_user(user=request.user)
    return redirect("desktops", current.id)


def _invitation_answered(request, invitation_id: str, *, accept: bool):
    """The invitee's answer; accepted, they land in the workspace they joined. None when refused (the
    page says why)."""
    try:
        membership = services.invitation_answer(user=request.user, invitation_id=invitation_id, accept=accept)
    except DomainError as exc:
        messages.error(request, exc.message)
        return None
    if membership is None:
        messages.success(request, _("Invitation declined."))
        return redirect("home")
    request.session["workspace"] = membership.workspace_id
    messages.success(
        request,
        _("Welcome to %(workspace)s. Your role here: %(role)s.")
        % {"workspace": membership.workspace.name, "role": membership.get_role_display()},
    )
    return redirect("desktops", membership.workspace_id)


@login_required
def invitations(request):
    """The invitations to the signed-in person's confirmed addresses: accept or decline each; those
    waiting for an address to be confirmed, said so; and a workspace of one's own instead."""
    if request.method == "POST":
        if request.POST.get("answer") == "own":
            services.workspace_ensure_for_user(user=request.user)
            return redirect("home")
        accept = request.POST.get("answer") == "accept"
        return _invitation_answered(request, request.POST.get("invitation", ""), accept=accept) or redirect(
            "invitations"
        )
    actor = Actor.from_request(request)
    return render(
        request,
        "missioncontrol/invitations.html",
        {
            "invitations": selectors.invitations_for(user=request.user),
            "waiting_for": selectors.invitations_unconfirmed(user=request.user),
            "has_workspace": selectors.workspaces_visible(actor=actor).exists(),
        },
    )


def invitation(request, token):
    """The page the invitation's e-mail links to: who invites whom to what, and the way to accept it,
    signed out (sign up or sign in), from an address still to confirm, or from the wrong account."""
    try:
        found = selectors.invitation_by_token(token=token)
    except NotFound as exc:
        response = render(request, "missioncontrol/invitation.html", {"gone": exc.message})
        response.status_code = 404
        return response
    here = reverse("invitation", args=[token])
    if request.method == "POST":
        if not request.user.is_authenticated:
            return redirect_to_login(here)
        accept = request.POST.get("answer") == "accept"
        return _invitation_answered(request, found.id, accept=accept) or redirect(here)
    context = {"invitation": found, "here": here}
    if not request.user.is_authenticated:
        # Following the e-mailed link proves the address, as a confirmation link does: signing up with
        # that address (and no other) from here needs no confirmation e-mail.
        invitation_link_remember(request, token)
        context["signup_url"] = (
            f"{reverse('account_signup')}?{urlencode({'email': found.email, 'next': here})}"
        )
        context["login_url"] = f"{reverse('account_login')}?{urlencode({'next': here})}"
    else:
        holds = services.invitation_open(user=request.user, invitation=found)
        answerable = selectors.invitations_for(user=request.user).filter(id=found.id).exists()
        context.update(answerable=answerable, to_confirm=holds and not answerable)
    return render(request, "missioncontrol/invitation.html", context)


# The workspace's pages the switcher keeps one on; every role may open them.
SWITCH_KEEPS = {"desktops", "costs", "settings", "alerts", "approvals"}


@login_required
def switch(request):
    """The workspace switcher's target: only a workspace of the user's, else back home; the same page
    of the other workspace when it is one of SWITCH_KEEPS."""
    wanted = request.GET.get("workspace", "")
    if not selectors.workspaces_visible(actor=Actor.from_request(request)).filter(id=wanted).exists():
        messages.error(request, _("No such workspace of yours."))
        return redirect("home")
    return redirect(request.GET.get("to") if request.GET.get("to") in SWITCH_KEEPS else "desktops", wanted)


# Desktops


@workspace_page()
def desktops(request, new_form=None):
    filters = forms.DesktopFilterForm(request.GET)
    filters.is_valid()
    label = filters.cleaned_data.get("label", "").strip().lower()
    state = filters.cleaned_data.get("state")
    rows = selectors.desktop_list(
        actor=request.actor,
        workspace_id=request.workspace.id,
        state=None if state == forms.FAILING else state,
        labels=[label] if label else None,
    )
    if filters.cleaned_data.get("q"):
        rows = rows.filter(name__icontains=filters.cleaned_data["q"])
    rows = selectors.desktops_with_outcome(rows.order_by("name"))
    if state == forms.FAILING:
        rows = rows.filter(selectors.FAILING)
    rows = Paginator(rows, PAGE_SIZE).get_page(request.GET.get("page"))
    spend = fleet_spend_shown(request.workspace)
    waiting = approvals.approvals_waiting_by_desktop(desktop_ids=[d.id for d in rows])
    for desktop in rows:
        desktop.waiting_approvals = waiting.get(desktop.id, 0)
        desktop.cost = spend.by_desktop.get(desktop.id, 0)
        desktop.failure = failure_of(desktop.outcome_detail) if desktop.outcome == "error" else None
        desktop.uptime = timezone.now() - desktop.state_changed_at if desktop.state in LIVE_STATES else None
    return page(
        request,
        "missioncontrol/desktops.html",
        summary=selectors.fleet_summary(workspace=request.workspace),
        spent=spend.total,
        desktops=rows,
        filters=filters,
        filtered=any(filters.cleaned_data.values()),
        query=query_without_page(request),
        new_form=new_form or forms.NewComputerForm(initial={"image_profile": "full"}),
        spend_alert=_latest_alert(request.workspace),
        confirmation_awaited=confirmation_awaited(workspace=request.workspace),
        labels=selectors.label_list(workspace=request.workspace),
    )


@require_POST
@workspace_page(Role.MEMBER)
def desktop_new(request):
    form = forms.NewComputerForm(request.POST)
    if form.is_valid():
        try:
            created = services.desktop_create(
                actor=request.actor,
                workspace=request.workspace,
                plan=form.cleaned_data["plan"],
                name=form.cleaned_data["name"],
                image_profile=form.cleaned_data["image_profile"],
            )
        except Invalid as exc:  # about what was typed: said beside it
            refused_onto(form, exc)
        except DomainError as exc:  # a quota, a race: said on the page
            messages.error(request, exc.message)
        else:
            messages.success(
                request,
                _("%(name)s is being provisioned.") % {"name": created.name},
                extra_tags=f"creating {created.id}",  # the list's script says what became of it
            )
            return redirect("desktops", request.workspace.id)
    # The form again as it was sent, its errors beside its fields: nothing typed is lost.
    response = desktops(request, workspace_id=request.workspace.id, new_form=form)
    response.status_code = 400
    return response


@require_POST
@workspace_page(Role.MEMBER)
def fleet_action(request):
    names = dict(
        selectors.desktop_list(actor=request.actor, workspace_id=request.workspace.id).values_list(
            "id", "name"
        )
    )
    form = forms.FleetActionForm(request.POST, desktop_names=names)
    if not form.is_valid():
        for errors in form.errors.values():
            messages.error(request, " ".join(errors))
        return redirect("desktops", request.workspace.id)
    action = form.cleaned_data["action"]
    if action in dict(forms.LABEL_ACTIONS):
        label, selected = form.cleaned_data["label"], form.cleaned_data["desktops"]
        change = {"add": [label]} if action == "label" else {"remove": [label]}
        attempt(
            request,
            lambda: desktops_label(
                actor=request.actor, workspace=request.workspace, desktop_ids=selected, **change
            ),
            ngettext(
                "%(label)s: %(count)d desktop changed.",
                "%(label)s: %(count)d desktops changed.",
                len(selected),
            )
            % {"label": label, "count": len(selected)},
        )
        return redirect("desktops", request.workspace.id)
    for desktop_id in form.cleaned_data["desktops"]:
        desktop = selectors.desktop_get(actor=request.actor, desktop_id=desktop_id)
        attempt(
            request,
            lambda d=desktop: services.desktop_act(actor=request.actor, desktop=d, action=action),
            _("%(name)s: “%(action)s” asked.")
            % {"name": desktop.name, "action": dict(forms.ACTIONS)[action]},
        )
    return redirect("desktops", request.workspace.id)


@login_required
def desktop(request, desktop_id, schedule_form=None):
    """The viewer (screen, terminal, chat), the timeline and the resources of one desktop; `schedule_form`
    is a schedule sent back with what is wrong with it, as it was filled in."""
    actor, found = _desktop_of(request, desktop_id)
    request.actor, request.workspace = actor, found.workspace
    request.role = selectors.role_in(actor=actor, workspace_id=found.workspace_id)
    events = selectors.desktop_events(desktop=found).order_by("-created_at")[:200]
    costs = costs_of_desktop(actor=actor, desktop_id=found.id, month=this_month())
    if found.state == DesktopState.DESTROYED:
        # Nothing left to watch or act on: what happened to it, and what it cost.
        destruction = selectors.desktop_destruction(desktop=found)
        by = _person_of(destruction.actor) if destruction else ""
        return page(
            request, "missioncontrol/desktop_destroyed.html", desktop=found, events=events, costs=costs, by=by
        )
    return page(
        request,
        "missioncontrol/desktop.html",
        desktop=found,
        # Each action with the states it may start from: the page shows those that apply now.
        lifecycle=[
            (action, label, sorted(TRANSITIONS[action].sources)) for action, label in forms.LIFECYCLE_ACTIONS
        ],
        can_control=request.role.rank >= Role(found.workspace.control_role).rank,
        events=events,
        usage=desktop_resource_usage(found),
        costs=costs,
        agent_usage=agent_usage_of_desktop(found),
        schedules=_schedules_of(found),
        schedule_form=schedule_form or forms.ScheduleForm(),
        # The viewer has no room for a list of messages above it: they come as toasts.
        messages_as_toasts=True,
        can_manage=request.role.rank >= Role.ADMIN.rank,
        egress=(policy := egress.egress_of_desktop(desktop=found)),
        blocked=desktop_blocked_egress(found),
        egress_form=forms.DesktopEgressForm(initial=_egress_initial(request, policy, inherit=True)),
        watchers=desktop_watchers(desktop=found),
        agent_key_missing=selectors.agent_key_missing(desktop=found),
    )


def _person_of(actor: str) -> str:
    """Who an actor's label names, as a reader says it: a person's address (theirs, or their API key's),
    support staff as such, the platform's own work as the platform's."""
    if key := Actor.key_of(actor):
        return key[1]
    kind, _sep, who = actor.partition(":")
    if kind == "user":
        return who
    if kind == "support":
        return _("%(who)s (support)") % {"who": who}
    if kind == "system":
        return _("Le Bureau (%(what)s)") % {"what": who}
    return actor


def _egress_initial(request, policy, *, inherit: bool = False) -> dict:
    """The policy as it is, or what the person typed when it was refused, so nothing they typed is lost."""
    return request.session.pop("egress_draft", None) or {
        "mode": forms.DesktopEgressForm.INHERIT if inherit and policy.inherited else policy.mode,
        "entries": "\n".join(policy.entries),
        "allow_llm_providers": policy.allow_llm_providers,
    }


def _errors_in_words(form) -> list[str]:
    """Each field's errors after its label, in the page's language; the form's own errors alone."""
    return [
        " ".join(errors)
        if field == "__all__"
        else _("%(field)s: %(errors)s")
        % {"field": form.fields[field].label or field, "errors": " ".join(errors)}
        for field, errors in form.errors.items()
    ]


def _egress_post(request, form, save, success: str) -> None:
    if not form.is_valid():
        for text in _errors_in_words(form):
            messages.error(request, text)
    elif attempt(request, save, success):
        return
    request.session["egress_draft"] = {
        "mode": request.POST.get("mode", ""),
        "entries": request.POST.get("entries", ""),
        "allow_llm_providers": bool(request.POST.get("allow_llm_providers")),
    }


@require_POST
@login_required
def desktop_egress(request, desktop_id):
    """The desktop's own egress policy, or back to its workspace's, from its page; admins only."""
    actor, desktop = _desktop_of(request, desktop_id)
    form = forms.DesktopEgressForm(request.POST)
    inherit = request.POST.get("mode") == forms.DesktopEgressForm.INHERIT
    _egress_post(
        request,
        form,
        lambda: (
            egress.desktop_egress_inherit(actor=actor, desktop_id=desktop.id)
            if inherit
            else egress.desktop_egress_set(actor=actor, desktop_id=desktop.id, **form.cleaned_data)
        ),
        _("The desktop follows its workspace's egress policy again; it applies within seconds.")
        if inherit
        else _("Egress policy saved: it applies to the desktop within seconds."),
    )
    return redirect(f"{reverse('desktop', args=[desktop.id])}#egress-panel")


@login_required
def watchers(request, desktop_id):
    """Who watches the desktop now and who has control: the viewer's presence line, fetched anew
    whenever someone opens or closes its screen or terminal."""
    _actor, found = _desktop_of(request, desktop_id)
    return render(request, "missioncontrol/watchers.html", {"watchers": desktop_watchers(desktop=found)})


def _schedules_of(desktop):
    rows = list(selectors.schedule_list(desktop=desktop))
    last_runs = selectors.schedule_last_runs(schedule_ids=[row.id for row in rows])
    for row in rows:
        row.last_run = last_runs.get(row.id)
    return rows


def _found(request, get, **ids):
    """The signed-in person and what `get` finds for them, or a 404 (never a hint it exists)."""
    actor = Actor.from_request(request)
    try:
        return actor, get(actor=actor, **ids)
    except NotFound as exc:
        raise Http404(exc.message) from exc


def _desktop_of(request, desktop_id):
    return _found(request, selectors.desktop_get, desktop_id=desktop_id)


@require_POST
@login_required
def schedule_new(request, desktop_id):
    """A scheduled message, from the desktop's page; the services check the control role."""
    actor, found = _desktop_of(request, desktop_id)
    form = forms.ScheduleForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            schedules.schedule_create(
                actor=actor,
                desktop=found,
                cron=data["cron"],
                message=data["message"],
                tz=data["timezone"],
                stop_after=data["stop_after"],
            )
        except Invalid as exc:
            refused_onto(form, exc)
        except DomainError as exc:  # who asks, not what was typed: said on the page
            messages.error(request, exc.message)
            return redirect(f"{reverse('desktop', args=[found.id])}#schedules-panel")
        else:
            messages.success(request, _("Schedule saved: the agent gets the message on time."))
            return redirect(f"{reverse('desktop', args=[found.id])}#schedules-panel")
    # The form again as it was sent, on its tab, what is wrong beside each field.
    response = desktop(request, desktop_id=found.id, schedule_form=form)
    response.status_code = 400
    return response


@require_POST
@login_required
def schedule_change(request, schedule_id):
    """Pause, resume or delete a schedule, from its desktop's page."""
    actor, schedule = _found(request, selectors.schedule_get, schedule_id=schedule_id)
    change = request.POST.get("change")
    if change == "delete":
        attempt(
            request, lambda: schedules.schedule_delete(actor=actor, schedule=schedule), _("Schedule deleted.")
        )
    elif change in ("pause", "resume"):
        attempt(
            request,
            lambda: schedules.schedule_update(actor=actor, schedule=schedule, enabled=change == "resume"),
            _("Schedule paused.") if change == "pause" else _("Schedule resumed."),
        )
    return redirect(f"{reverse('desktop', args=[schedule.desktop_id])}#schedules-panel")


# Answered requests shown under the queue, newest first.
RECENT_APPROVALS = 20


@workspace_page()
def approval_queue(request):
    """The requests for approval waiting for an answer (the whole workspace's, or one desktop's with
    `?desktop=`), with the latest answered ones; `?fragment=1` is the list alone, which the live pages
    fetch again whenever one is made or answered."""
    desktop_id = request.GET.get("desktop") or None
    scope = {"actor": request.actor, "workspace_id": request.workspace.id, "desktop_id": desktop_id}
    pending = approvals.approval_list(**scope, status=approvals.Status.PENDING).order_by("requested_at")
    answered = approvals.approval_list(**scope).exclude(id__in=pending.values("id"))[:RECENT_APPROVALS]
    for approval in answered:
        approval.shown_status = approvals.approval_status(approval)
    needed = approvals.approval_role_needed(request.workspace)
    template = (
        "missioncontrol/approval_list.html"
        if request.GET.get("fragment")
        else "missioncontrol/approvals.html"
    )
    return page(
        request,
        template,
        pending=pending,
        answered=answered,
        desktop_id=desktop_id or "",
        can_answer=request.role.rank >= needed.rank,
        approval_role=needed.label,
    )


@require_POST
@login_required
def approval_decide(request, approval_id):
    """Approve or deny, with a comment, from the queue; back to where it was answered from."""
    actor, approval = _found(request, approvals.approval_get, approval_id=approval_id)
    approve = request.POST.get("decision") == "approve"
    attempt(
        request,
        lambda: approvals.approval_decide(
            actor=actor, approval_id=approval.id, approve=approve, comment=request.POST.get("comment", "")
        ),
        _("Approved.") if approve else _("Denied."),
    )
    if request.headers.get("X-Requested-With") == "fetch":
        return HttpResponse(status=204)
    return redirect(reverse("approvals", args=[approval.desktop.workspace_id]))


# Alerts shown on one page of the list.
ALERTS_SHOWN = 100


@workspace_page()
def alert_list(request):
    """The workspace's alerts, filtered (`status`, `kind`, `desktop`; open ones by default);
    `?fragment=1` is the list alone, which the page fetches again whenever one is raised or acknowledged."""
    status = request.GET.get("status", alerts.Status.OPEN)
    kind, desktop_id = request.GET.get("kind", ""), request.GET.get("desktop", "")
    found = alerts.alert_list(
        actor=request.actor,
        workspace_id=request.workspace.id,
        desktop_id=desktop_id or None,
        status=status if status in alerts.Status.values else None,
        kind=kind if kind in alerts.Kind.values else None,
    )[:ALERTS_SHOWN]
    for alert in found:
        alert.message = alerts.alert_message(alert)
    return page(
        request,
        "missioncontrol/alert_list.html" if request.GET.get("fragment") else "missioncontrol/alerts.html",
        alerts=found,
        status=status,
        kind=kind,
        desktop_id=desktop_id,
        statuses=alerts.Status.choices,
        kinds=alerts.Kind.choices,
        desktops=selectors.desktop_list(actor=request.actor, workspace_id=request.workspace.id),
        filters=request.GET.urlencode(),
        can_acknowledge=request.role.rank >= Role(request.workspace.control_role).rank,
    )


@require_POST
@login_required
def alert_acknowledge(request, alert_id):
    actor, alert = _found(request, alerts.alert_get, alert_id=alert_id)
    attempt(request, lambda: alerts.alert_acknowledge(actor=actor, alert_id=alert.id), _("Acknowledged."))
    if request.headers.get("X-Requested-With") == "fetch":
        return HttpResponse(status=204)
    return redirect(reverse("alerts", args=[alert.workspace_id]))


def workspace_events(request, workspace_id):
    """Live desktop states: one server-sent event stream per workspace, for its members only.

    Refused up front with a 403 (which also stops the browser's reconnecting), rather than
    inside an open stream.
    """
    if role_in(actor=Actor.from_request(request), workspace_id=workspace_id) is None:
        return HttpResponseForbidden("Not a member of this workspace.")
    request.user.pk  # noqa: B018  (load the user now: the stream must not need the database)
    connection.close()  # an open page must not hold a database connection for as long as it is open
    response = eventstream_events(request, channels=[workspace_stream(workspace_id)])
    if response.streaming:
        response.streaming_content = watched(response.streaming_content)
    return response


# Settings


@workspace_page()
def settings_page(request, **bound):
    """The workspace's settings; `bound` holds a form sent back with its errors, as it was filled in."""
    workspace = request.workspace
    can_manage = request.role.rank >= Role.ADMIN.rank
    usage_total, usage_desktops = agent_usage_of_workspace(workspace)
    return page(
        request,
        "missioncontrol/settings.html",
        usage_total=usage_total,
        usage_desktops=usage_desktops,
        members=selectors.membership_list(workspace=workspace),
        invitations=selectors.invitation_list(workspace=workspace) if can_manage else [],
        invite_again=request.session.pop("invite_again", None),
        api_keys=selectors.api_key_list(actor=request.actor, workspace_id=workspace.id) if can_manage else [],
        llm_keys=selectors.llm_key_list(actor=request.actor, workspace_id=workspace.id) if can_manage else [],
        model_prices=model_price_list(workspace=workspace),
        **{
            "rename_form": forms.RenameForm(initial={"name": workspace.name}),
            "invite_form": forms.InviteForm(),
            "api_key_form": forms.ApiKeyForm(),
            "llm_key_form": forms.LLMKeyForm(),
            "model_price_form": forms.ModelPriceForm(initial={"model": agent_model(workspace)}),
            "thresholds_form": forms.AlertThresholdsForm(initial=alerts.thresholds_of(workspace)),
            **bound,
        },
        agent_model=agent_model(workspace),
        egress=(policy := egress.egress_of_workspace(workspace=workspace)),
        egress_form=forms.EgressForm(initial=_egress_initial(request, policy)),
        roles=Role.choices,
        new_token=request.session.pop("new_token", None),
        approval_form=forms.ApprovalPolicyForm(
            initial={
                "approval_role": workspace.approval_role,
                "approval_timeout": workspace.approval_timeout // 60,
                "approval_commands": "\n".join(workspace.approval_commands),
                "webhook_url": workspace.approval_webhook_url,
            }
        ),
        webhook_deliveries=(
            webhooks.webhook_deliveries(actor=request.actor, workspace_id=workspace.id)[:RECENT_DELIVERIES]
            if can_manage
            else []
        ),
        new_webhook_secret=request.session.pop("new_webhook_secret", None),
    )


def _settings_post(form_class, apply, success, shown_as=""):
    """A settings form: validate, call the service, come back to the settings page. Refused, a form
    the page shows (`shown_as`, its name there) comes back as it was filled in, with why."""

    @require_POST
    @workspace_page(Role.VIEWER)
    def view(request, **kwargs):
        form = form_class(request.POST)
        if form.is_valid():
            try:
                apply(request, form.cleaned_data, **kwargs)
            except Invalid as exc:  # about what was typed: said with the form, beside its fields
                refused_onto(form, exc)
            except DomainError as exc:  # about who or when (a role, a state): said on the page
                messages.error(request, exc.message)
                return redirect("settings", request.workspace.id)
            else:
                if success:
                    messages.success(request, success)
                return redirect("settings", request.workspace.id)
        if shown_as:
            response = settings_page(request, workspace_id=request.workspace.id, **{shown_as: form})
            response.status_code = 400
            return response
        for text in _errors_in_words(form):
            messages.error(request, text)
        return redirect("settings", request.workspace.id)

    return view


# Webhook deliveries shown on the settings page, newest first (the API pages through them all).
RECENT_DELIVERIES = 10


def _approval_policy(request, data):
    with transaction.atomic():  # every change or none
        approvals.approval_policy_set(
            actor=request.actor,
            workspace_id=request.workspace.id,
            role=data["approval_role"],
            timeout=data["approval_timeout"] * 60,
            commands=data["approval_commands"].splitlines(),
        )
        _workspace, secret = webhooks.webhook_set(
            actor=request.actor,
            workspace_id=request.workspace.id,
            url=data["webhook_url"],
            rotate_secret=data["rotate_secret"],
        )
    if secret:
        request.session["new_webhook_secret"] = secret  # shown once, on the next page, then gone


def _new_api_key(request, data):
    _key, token = services.api_key_create(actor=request.actor, workspace_id=request.workspace.id, **data)
    request.session["new_token"] = token  # shown once, on the next page, then gone


@require_POST
@workspace_page(Role.VIEWER)
def workspace_egress(request):
    """The workspace's egress policy, from the settings page; the services check the role."""
    form = forms.EgressForm(request.POST)
    _egress_post(
        request,
        form,
        lambda: egress.workspace_egress_set(
            actor=request.actor, workspace_id=request.workspace.id, **form.cleaned_data
        ),
        _("Egress policy saved: the workspace's desktops follow it within seconds."),
    )
    return redirect(f"{reverse('settings', args=[request.workspace.id])}#egress")


workspace_rename = _settings_post(
    forms.RenameForm,
    lambda r, d: services.workspace_rename(actor=r.actor, workspace_id=r.workspace.id, name=d["name"]),
    _lazy("Workspace renamed."),
    shown_as="rename_form",
)
alert_thresholds_set = _settings_post(
    forms.AlertThresholdsForm,
    lambda r, d: alerts.alert_thresholds_set(actor=r.actor, workspace_id=r.workspace.id, thresholds=d),
    _lazy("Alert thresholds saved."),
    shown_as="thresholds_form",
)
approval_policy_set = _settings_post(
    forms.ApprovalPolicyForm, _approval_policy, _lazy("Approval policy saved.")
)
agent_command_set = _settings_post(
    forms.AgentCommandForm,
    lambda r, d: services.workspace_agent_command_set(
        actor=r.actor, workspace_id=r.workspace.id, command=d["command"]
    ),
    _lazy("Agent command saved."),
)
member_invite = _settings_post(
    forms.InviteForm,
    lambda r, d: services.member_invite(actor=r.actor, workspace_id=r.workspace.id, **d),
    _("Invitation sent: they join once they accept it from that address."),
    shown_as="invite_form",
)
member_role = _settings_post(
    forms.RoleForm,
    lambda r, d, membership_id: services.membership_set_role(
        actor=r.actor, workspace_id=r.workspace.id, membership_id=membership_id, role=d["role"]
    ),
    _lazy("Role changed."),
)
api_key_new = _settings_post(
    forms.ApiKeyForm,
    _new_api_key,
    _lazy("API key created: copy it now, it is shown once."),
    shown_as="api_key_form",
)
llm_key_new = _settings_post(
    forms.LLMKeyForm,
    lambda r, d: services.llm_key_save(actor=r.actor, workspace_id=r.workspace.id, **d),
    _lazy("LLM key added. Its provider is being asked whether it takes it: see its answer below."),
    shown_as="llm_key_form",
)
model_price_set = _settings_post(
    forms.ModelPriceForm,
    lambda r, d: billing.model_price_set(actor=r.actor, workspace_id=r.workspace.id, **d),
    _lazy("Model price saved."),
    shown_as="model_price_form",
)
llm_key_rotate = _settings_post(
    forms.RotateForm,
    lambda r, d, key_id: services.llm_key_save(
        actor=r.actor,
        workspace_id=r.workspace.id,
        key=(key := selectors.llm_key_get(actor=r.actor, key_id=key_id)),
        provider=key.provider,
        name=key.name,
        base_url=key.base_url,
        model=key.model,
        secret=d["secret"],
    ),
    _lazy("LLM key rotated."),
)


def _settings_delete(apply, success, invite_again=None):
    """A removal from the settings page. With `invite_again` (what was removed -> (email, role)), the
    page then offers to invite the same person again, in one click: the cheap undo of a slip."""

    @require_POST
    @workspace_page(Role.VIEWER)
    def view(request, object_id):
        removed = []
        if attempt(request, lambda: removed.append(apply(request, object_id)), success) and invite_again:
            email, role = invite_again(removed[0])
            request.session["invite_again"] = {"email": email, "role": role}
        return redirect("settings", request.workspace.id)

    return view


invitation_revoke = _settings_delete(
    lambda r, i: services.invitation_revoke(actor=r.actor, workspace_id=r.workspace.id, invitation_id=i),
    _lazy("Invitation withdrawn."),
    invite_again=lambda invitation: (invitation.email, invitation.role),
)
member_remove = _settings_delete(
    lambda r, i: services.membership_remove(actor=r.actor, workspace_id=r.workspace.id, membership_id=i),
    _lazy("Member removed: they lost access to the workspace's desktops at once."),
    invite_again=lambda membership: (membership.user.email, membership.role),
)
api_key_revoke = _settings_delete(
    lambda r, i: services.api_key_revoke(actor=r.actor, workspace_id=r.workspace.id, key_id=i),
    _lazy("API key revoked."),
)
model_price_delete = _settings_delete(
    lambda r, i: billing.model_price_delete(actor=r.actor, workspace_id=r.workspace.id, price_id=i),
    _lazy("Model price removed."),
)
llm_key_delete = _settings_delete(
    lambda r, i: services.llm_key_delete(actor=r.actor, workspace_id=r.workspace.id, key_id=i),
    _lazy("LLM key removed."),
)


@require_POST
@workspace_page(Role.OWNER)
def workspace_delete(request):
    if request.POST.get("confirm") != request.workspace.name:
        messages.error(request, _("Type the workspace's name to delete it."))
        return redirect("settings", request.workspace.id)
    if attempt(
        request, lambda: services.workspace_delete(actor=request.actor, workspace_id=request.workspace.id)
    ):
        request.session.pop("workspace", None)
        return redirect("home")
    return redirect("settings", request.workspace.id)


# Audit


class _Echo:
    """A file that hands back what csv writes, so rows stream out as they are made."""

    def write(self, value):
        return value


@workspace_page(Role.ADMIN)
def audit(request):
    filters = forms.AuditFilterForm(request.GET)
    filters.is_valid()
    query = {k: v for k, v in filters.cleaned_data.items() if v}
    for bound, at in (("since", time.min), ("until", time.max)):
        if bound in query:
            query[bound] = timezone.make_aware(datetime.combine(query[bound], at))
    events = selectors.audit_list(workspace=request.workspace, **query)
    if request.GET.get("format") == "csv":
        fields = ["at", "actor", "action", "target", "ip", "request_id", "detail"]
        writer = csv.writer(_Echo())

        def lines():
            yield writer.writerow(fields)
            for event in events.iterator():
                yield writer.writerow([safe_cell(getattr(event, f)) for f in fields])

        response = StreamingHttpResponse(lines(), content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="audit-{request.workspace.id}.csv"'
        return response
    shown = Paginator(events, 100).get_page(request.GET.get("page"))
    names = selectors.audit_target_names(workspace=request.workspace, events=list(shown))
    for event in shown:
        event.target_name = names.get(event.target, "")
        event.action_words = action_words(event.action)
        if key := Actor.key_of(event.actor):  # the person, and the key by its name
            event.actor_email, event.actor_key = key[1], names.get(key[0], key[0])
        event.actor_name = _person_of(event.actor)
    return page(
        request,
        "missioncontrol/audit.html",
        filters=filters,
        events=shown,
        filtered=bool(query),
        actions=sorted(ACTIONS.items()),
        query=query_without_page(request),
    )


# Costs


def _latest_alert(workspace):
    """This month's highest spend warning, for the fleet's pages."""
    alerts = spend_alerts_this_month(workspace=workspace)
    return alerts[-1] if alerts else None


@workspace_page()
def costs(request):
    """The month's costs: totals, what is owed, the daily charts, the top spenders, a CSV export."""
    try:
        month = month_parse(request.GET.get("month", ""))
    except ValueError:
        month = this_month()
    report = costs_of_workspace(actor=request.actor, workspace_id=request.workspace.id, month=month)
    if request.GET.get("format") == "csv":
        return _costs_csv(report)
    return page(
        request,
        "missioncontrol/costs.html",
        costs=report,
        quota=quota_of(actor=request.actor, workspace_id=request.workspace.id),
        cost_chart=bar_chart(
            [(_day_label(d.day), d.meter.total, f"{d.day}: {euros(d.meter.total)}") for d in report.days],
            peak_label=euros,
        ),
        running_chart=bar_chart(
            [(_day_label(d.day), d.running_peak, _running_title(d)) for d in report.days], peak_label=str
        ),
        top=[d for d in report.desktops if d.meter.total][:5],
        previous_month=month_of(month - timedelta(days=1)),
        next_month=next_month(month) if month < this_month() else None,
        spend_alert=report.alerts[-1] if report.alerts else None,
    )


def _running_title(row) -> str:
    return _("%(day)s: %(count)d running at most") % {"day": row.day, "count": row.running_peak}


def _day_label(day) -> str:
    # Every fifth day is labelled; the others are in the bars' titles.
    return str(day.day) if day.day == 1 or day.day % 5 == 0 else ""


COSTS_CSV = [
    "day",
    "desktop_id",
    "desktop",
    "plan",
    "running_hours",
    "suspended_hours",
    "stopped_hours",
    "gib_hours",
    "input_tokens",
    "output_tokens",
    "compute_eur",
    "storage_eur",
    "models_eur",
    "total_eur",
]
FOUR = Decimal("0.0001")


def _costs_csv(report) -> HttpResponse:
    """One row per desktop and day, to four decimals (the page rounds to the cent)."""
    response = HttpResponse(content_type="text/csv")
    name = f"costs-{report.workspace.id}-{report.month:%Y-%m}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    writer = csv.writer(response)
    writer.writerow(COSTS_CSV)
    for item in report.desktops:
        desktop = item.desktop
        for day, m in item.days.items():
            figures = [
                m.running_hours,
                m.suspended_hours,
                m.stopped_hours,
                m.gib_hours,
                m.input_tokens,
                m.output_tokens,
                m.compute,
                m.storage,
                m.models,
                m.total,
            ]
            cells = [day.isoformat(), desktop.id, desktop.name, desktop.plan.name]
            cells += [f.quantize(FOUR) if isinstance(f, Decimal) else f for f in figures]
            writer.writerow([safe_cell(c) for c in cells])
    return response


def pricing(request):
    """The tiers and the plans' prices, for anyone, signed in or not."""
    return render(request, "missioncontrol/pricing.html", {"tiers": tier_list(), "plans": plan_prices()})
