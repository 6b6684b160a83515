from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render

from desktops import selectors
from desktops.audit import Actor
from desktops.errors import NotFound
from desktops.models import Role


@login_required
def home(request):
    actor = Actor.from_request(request)
    return render(
        request,
        "missioncontrol/home.html",
        {
            "workspaces": selectors.workspaces_visible(actor=actor),
            "desktops": selectors.desktop_list(actor=actor).select_related("workspace")[:200],
        },
    )


@login_required
def desktop(request, desktop_id):
    """The viewer: screen, terminal and chat of one desktop."""
    actor = Actor.from_request(request)
    try:
        found = selectors.desktop_get(actor=actor, desktop_id=desktop_id)
    except NotFound as exc:
        raise Http404(exc.message) from exc
    role = selectors.role_in(actor=actor, workspace_id=found.workspace_id)
    return render(
        request,
        "missioncontrol/desktop.html",
        {"desktop": found, "can_control": role.rank >= Role.MEMBER.rank},
    )
