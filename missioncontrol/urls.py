from django.urls import path

from missioncontrol import views

urlpatterns = [
    path("", views.home, name="home"),
    path("desktops/<str:desktop_id>/", views.desktop, name="desktop"),
]
