"""The guest endpoint's URLs, all of them: a desktop that reaches this listener finds nothing else
(no pages, no API, no admin)."""

from django.urls import path, re_path

from desktops.api import guest
from desktops.api.errors import not_found

urlpatterns = [
    path("v1/desktop", guest.WhoAmI.as_view()),
    path("v1/approvals", guest.ApprovalAsk.as_view()),
    path("v1/approvals/<str:approval_id>", guest.ApprovalAnswer.as_view()),
    path("v1/activity", guest.Activity.as_view()),
    path("v1/screen/screenshot", guest.ScreenLook.as_view()),
    path("v1/screen/actions", guest.ScreenActions.as_view()),
    re_path(r"^", not_found),
]
