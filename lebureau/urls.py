from allauth.account.decorators import secure_admin_login
from django.contrib import admin
from django.urls import include, path

# The admin signs in through Mission Control's own sign-in page, which limits failed attempts.
admin.site.login = secure_admin_login(admin.site.login)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("allauth.urls")),
    path("api/", include("desktops.api.urls")),
    path("", include("missioncontrol.urls")),
]
