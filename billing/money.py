"""Amounts as people read them: euros, to the cent (or finer, for unit prices), in their language's form."""

from decimal import ROUND_HALF_UP, Decimal

from django.utils.formats import number_format
from django.utils.translation import gettext as _


def euros(amount: Decimal | int, places: int = 2) -> str:
    figure = number_format(Decimal(amount).quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP), places)
    # The symbol's place is the language's: before in English, after (and apart) in French.
    return _("€%(amount)s") % {"amount": figure}
