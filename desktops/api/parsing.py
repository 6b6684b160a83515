"""How the API reads request bodies."""

from django.utils.translation import gettext_lazy as _
from djangorestframework_camel_case.parser import CamelCaseJSONParser
from rest_framework.exceptions import ParseError


class JSONParser(CamelCaseJSONParser):
    """JSON with camelCase keys; a body nested past Python's recursion limit is a 400 like any other
    malformed body (the standard parser lets the RecursionError out as a 500)."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(_("The JSON body is nested too deeply.")) from None
