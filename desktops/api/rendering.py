"""What the API shows besides its JSON: the answer to OPTIONS and the browsable pages.

DRF builds both for views that read through a ``queryset`` and take input in their
``serializer_class``: OPTIONS fetches the object (``get_object``) to describe the fields of PUT and
POST, the browsable list pages build a filter form from ``get_queryset()``. Our views read through
the selectors, scoped to the actor, and parse input with serializers of their own, so that
description would be wrong, and the lookups fail where a view has no queryset. These keep the rest;
the OpenAPI schema (``/api/schema/``) describes the inputs.
"""

from djangorestframework_camel_case.render import CamelCaseBrowsableAPIRenderer
from rest_framework.metadata import SimpleMetadata
from rest_framework.negotiation import BaseContentNegotiation


class Metadata(SimpleMetadata):
    """The endpoint's name, description and formats; its methods are in the ``Allow`` header."""

    def determine_actions(self, request, view):
        return {}


class BrowsableAPIRenderer(CamelCaseBrowsableAPIRenderer):
    """The browsable pages without a filter form: the API has no filter backends to fill one."""

    def get_filter_form(self, data, view, request):
        return None


class ImageNegotiation(BaseContentNegotiation):
    """For an endpoint that answers with an image: ``?format=`` names the image's format there, not
    one of DRF's renderers, and its errors are JSON whatever the client accepts."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type
