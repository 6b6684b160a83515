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


class Metadata(SimpleMetadata):
    """The endpoint's name, description and formats; its methods are in the ``Allow`` header."""

    def determine_actions(self, request, view):
        return {}


class BrowsableAPIRenderer(CamelCaseBrowsableAPIRenderer):
    """The browsable pages without a filter form: the API has no filter backends to fill one."""

    def get_filter_form(self, data, view, request):
        return None
