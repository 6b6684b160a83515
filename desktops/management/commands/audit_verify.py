from django.core.management.base import BaseCommand, CommandError
from django.utils.translation import gettext as _

from desktops.audit import audit_chain_verify


class Command(BaseCommand):
    help = (
        "Check the audit trail's hash chain from its latest signed checkpoint (or its first event) to its "
        "head, and against the head last exported to AUDIT_HEAD_LOG; exit 1 naming the first broken link."
    )

    def handle(self, **options):
        report = audit_chain_verify()
        if report.broken is not None:
            raise CommandError(
                _("Audit chain broken at event #%(seq)d: %(reason)s (%(checked)d events verified before it).")
                % {"seq": report.broken.seq, "reason": report.broken.reason, "checked": report.checked}
            )
        self.stdout.write(_("Audit chain intact: %(checked)d events verified.") % {"checked": report.checked})
        if report.exported is not None:
            self.stdout.write(
                _("It holds the head exported at %(at)s (event #%(seq)d).")
                % {"at": report.exported.at, "seq": report.exported.seq}
            )
