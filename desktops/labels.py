"""Labels file desktops into fleets (`ci`, `team-a`, `env=prod`): lists filter by them, bulk actions
select by them, always within one workspace."""

from __future__ import annotations

from collections.abc import Sequence

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Count
from django.utils.translation import gettext as _

from desktops.audit import Actor, audit_record
from desktops.errors import Invalid
from desktops.models import Desktop, DesktopLabel, Workspace, label_validator

MAX_PER_DESKTOP = 20


def labels_checked(names: Sequence[str]) -> list[str]:
    """The labels, trimmed, lowercased, each once, in order; a 400 naming the first that is not one."""
    labels = list(dict.fromkeys(name.strip().lower() for name in names))
    for label in labels:
        try:
            label_validator(label)
        except ValidationError as exc:
            raise Invalid(
                _("%(label)r is not a label: %(why)s") % {"label": label, "why": exc.messages[0]},
                fields={"labels": exc.messages},
            ) from exc
    if len(labels) > MAX_PER_DESKTOP:
        raise Invalid(
            _("A desktop has at most %(max)d labels.") % {"max": MAX_PER_DESKTOP},
            fields={"labels": [_("Too many.")]},
        )
    return labels


def desktops_label(
    *, actor: Actor, workspace: Workspace, desktop_ids: Sequence[str], add=(), remove=()
) -> list[str]:
    """Add and remove labels on these desktops of the workspace (others are left alone); the ids
    labelled. The caller has checked the actor may act in the workspace."""
    add, remove = labels_checked(add), labels_checked(remove)
    with transaction.atomic():
        # Locked, so that two concurrent changes cannot both pass the per-desktop limit.
        ids = list(
            Desktop.objects.select_for_update()
            .filter(workspace=workspace, id__in=desktop_ids)
            .exclude(state="destroyed")
            .values_list("id", flat=True)
        )
        DesktopLabel.objects.filter(desktop_id__in=ids, name__in=remove).delete()
        DesktopLabel.objects.bulk_create(
            [DesktopLabel(desktop_id=i, name=name) for i in ids for name in add], ignore_conflicts=True
        )
        crowded = (
            DesktopLabel.objects.filter(desktop_id__in=ids)
            .values("desktop_id")
            .annotate(n=Count("id"))
            .filter(n__gt=MAX_PER_DESKTOP)
        )
        if crowded.exists():
            raise Invalid(
                _("A desktop has at most %(max)d labels.") % {"max": MAX_PER_DESKTOP},
                fields={"add": [_("Too many for a desktop.")]},
            )
        for desktop_id in ids:
            audit_record(
                actor=actor,
                action="desktop.label",
                workspace_id=workspace.id,
                target=desktop_id,
                add=add,
                remove=remove,
            )
    return ids
