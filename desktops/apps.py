from django.apps import AppConfig


class DesktopsConfig(AppConfig):
    name = "desktops"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from desktops import receivers  # noqa: F401  (connects the login hooks)
