from django.core.management.base import BaseCommand

from desktops import lifecycle


class Command(BaseCommand):
    help = (
        "Compare the compute engines this host reaches with the database now (beat does it every "
        "RECONCILE_INTERVAL): mend stuck steps, put vanished desktops in error, report drift and "
        "orphans, remove orphans seen for ORPHAN_GRACE."
    )

    def handle(self, **options):
        report = lifecycle.reconcile()
        for kind, keys in report.items():
            self.stdout.write(f"{kind}: {len(keys)}" + (f" ({', '.join(keys)})" if keys else ""))
