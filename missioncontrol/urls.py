from django.urls import path

from missioncontrol import views

urlpatterns = [
    path("", views.home, name="home"),
    path("switch/", views.switch, name="switch"),
    path("invitations/", views.invitations, name="invitations"),
    path("invitations/<str:token>/", views.invitation, name="invitation"),
    path(
        "w/<str:workspace_id>/invitations/<str:object_id>/withdraw/",
        views.invitation_revoke,
        name="invitation_revoke",
    ),
    path("w/<str:workspace_id>/desktops/", views.desktops, name="desktops"),
    path("w/<str:workspace_id>/desktops/new/", views.desktop_new, name="desktop_new"),
    path("w/<str:workspace_id>/desktops/actions/", views.fleet_action, name="fleet_action"),
    path("w/<str:workspace_id>/settings/", views.settings_page, name="settings"),
    path("w/<str:workspace_id>/settings/rename/", views.workspace_rename, name="workspace_rename"),
    path("w/<str:workspace_id>/settings/agent/", views.agent_command_set, name="agent_command_set"),
    path("w/<str:workspace_id>/settings/egress/", views.workspace_egress, name="workspace_egress"),
    path("w/<str:workspace_id>/settings/approvals/", views.approval_policy_set, name="approval_policy_set"),
    path("w/<str:workspace_id>/settings/alerts/", views.alert_thresholds_set, name="alert_thresholds_set"),
    path("w/<str:workspace_id>/settings/delete/", views.workspace_delete, name="workspace_delete"),
    path("w/<str:workspace_id>/members/invite/", views.member_invite, name="member_invite"),
    path("w/<str:workspace_id>/members/<str:membership_id>/role/", views.member_role, name="member_role"),
    path("w/<str:workspace_id>/members/<str:object_id>/remove/", views.member_remove, name="member_remove"),
    path("w/<str:workspace_id>/keys/new/", views.api_key_new, name="api_key_new"),
    path("w/<str:workspace_id>/keys/<str:object_id>/revoke/", views.api_key_revoke, name="api_key_revoke"),
    path("w/<str:workspace_id>/llm-keys/new/", views.llm_key_new, name="llm_key_new"),
    path("w/<str:workspace_id>/llm-keys/<str:key_id>/rotate/", views.llm_key_rotate, name="llm_key_rotate"),
    path(
        "w/<str:workspace_id>/llm-keys/<str:object_id>/delete/", views.llm_key_delete, name="llm_key_delete"
    ),
    path("w/<str:workspace_id>/audit/", views.audit, name="audit"),
    path("w/<str:workspace_id>/approvals/", views.approval_queue, name="approvals"),
    path("approvals/<str:approval_id>/decide/", views.approval_decide, name="approval_decide"),
    path("w/<str:workspace_id>/alerts/", views.alert_list, name="alerts"),
    path("alerts/<str:alert_id>/acknowledge/", views.alert_acknowledge, name="alert_acknowledge"),
    path("w/<str:workspace_id>/costs/", views.costs, name="costs"),
    path("w/<str:workspace_id>/model-prices/new/", views.model_price_set, name="model_price_set"),
    path(
        "w/<str:workspace_id>/model-prices/<str:object_id>/delete/",
        views.model_price_delete,
        name="model_price_delete",
    ),
    path("pricing/", views.pricing, name="pricing"),
    path("desktops/<str:desktop_id>/", views.desktop, name="desktop"),
    path("desktops/<str:desktop_id>/egress/", views.desktop_egress, name="desktop_egress"),
    path("desktops/<str:desktop_id>/watchers/", views.watchers, name="watchers"),
    path("desktops/<str:desktop_id>/schedules/new/", views.schedule_new, name="schedule_new"),
    path("schedules/<str:schedule_id>/", views.schedule_change, name="schedule_change"),
    path("events/w/<str:workspace_id>/", views.workspace_events, name="workspace_events"),
]
