"""`{% state_labels %}`: the desktop states' labels in the page's language, for its scripts (states.js),
from the one list the pages and the services use."""

from django import template
from django.utils.html import json_script

from desktops.models import DesktopState

register = template.Library()


@register.simple_tag
def state_labels() -> str:
    return json_script(dict(DesktopState.choices), "state-labels")
