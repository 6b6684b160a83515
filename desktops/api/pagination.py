"""Pages of a list: ``page`` (a number from 1, or ``last``) and ``pageSize`` (1 to 200).

DRF's own pagination serves its default size for a ``pageSize`` it cannot read and answers 404 to a
``page`` that is not a number; here both are a 400 naming the parameter, like any other bad input.
A page past the last is still a 404.
"""

from rest_framework import serializers
from rest_framework.pagination import PageNumberPagination


class Pagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "pageSize"
    max_page_size = 200

    def get_page_number(self, request, paginator):
        number = request.query_params.get(self.page_query_param)
        if number is None:
            return 1
        if number in self.last_page_strings:
            return paginator.num_pages
        return _number(self.page_query_param, number)

    def get_page_size(self, request):
        size = request.query_params.get(self.page_size_query_param)
        if size is None:
            return self.page_size
        return _number(self.page_size_query_param, size, self.max_page_size)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        number = {"type": "integer", "minimum": 1}
        for parameter in parameters:
            if parameter["name"] == self.page_query_param:
                last = {"type": "string", "enum": list(self.last_page_strings)}
                parameter["schema"] = {"anyOf": [number, last]}
            elif parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {**number, "maximum": self.max_page_size}
        return parameters


def _number(name: str, value: str, maximum: int | None = None) -> int:
    try:
        return serializers.IntegerField(min_value=1, max_value=maximum).run_validation(value)
    except serializers.ValidationError as exc:
        raise serializers.ValidationError({name: exc.detail}) from exc
