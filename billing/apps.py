from django.apps import AppConfig
from django.db.models.signals import post_migrate


class BillingConfig(AppConfig):
    name = "billing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from billing.seed import tiers_ensure

        post_migrate.connect(tiers_ensure, sender=self)
