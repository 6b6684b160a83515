from allauth.account.decorators import secure_admin_login
from django.contrib import admin
from django.urls import include, path
from django.views.i18n import JavaScriptCatalog

# The admin signs in through Mission Control's own sign-in page, which limits failed attempts.
admin.site.login = secure_admin_login(admin.site.login)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("allauth.urls")),
    path("api/", include("desktops.api.urls")),
    # The pages' scripts' own strings, in the reader's language (gettext and interpolate in the browser).
    path("jsi18n/", JavaScriptCatalog.as_view(), name="javascript-catalog"),
    path("", include("missioncontrol.urls")),
]
