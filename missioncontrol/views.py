from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from desktops import selectors
from desktops.audit import Actor


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
