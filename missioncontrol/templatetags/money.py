"""`{{ amount|euros }}`: an amount as the page's reader writes it (€12.34, 12,34 €)."""

from django import template

from billing import money

register = template.Library()


@register.filter
def euros(amount, places: int = 2) -> str:
    return money.euros(amount, int(places))
