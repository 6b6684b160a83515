from django.urls import path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import SimpleRouter

from desktops.api import views
from desktops.api.errors import not_found


class Router(SimpleRouter):
    # The seed documents call /api/desktops without a trailing slash; accept both.
    def __init__(self):
        super().__init__()
        self.trailing_slash = "/?"


router = Router()
router.register("desktops", views.DesktopViewSet, basename="desktop")
router.register("plans", views.PlanViewSet, basename="plan")
router.register("tiers", views.TierViewSet, basename="tier")
router.register("workspaces", views.WorkspaceViewSet, basename="workspace")
router.register("invitations", views.InvitationViewSet, basename="invitation")
router.register("keys", views.ApiKeyViewSet, basename="api-key")
router.register("llm-keys", views.LLMKeyViewSet, basename="llm-key")
router.register("audit", views.AuditViewSet, basename="audit")
router.register("schedules", views.ScheduleViewSet, basename="schedule")
router.register("approvals", views.ApprovalViewSet, basename="approval")
router.register("alerts", views.AlertViewSet, basename="alert")

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves its start-up script as a file: the pages' CSP allows no inline script.
    path(
        "docs/",
        SpectacularSwaggerSplitView.as_view(url_name="schema", template_name="missioncontrol/api_docs.html"),
        name="docs",
    ),
    *router.urls,
    re_path(r"^", not_found),  # every other path, including ones with a line break
]
