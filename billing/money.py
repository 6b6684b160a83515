"""Amounts as people read them: euros, to the cent."""

from decimal import ROUND_HALF_UP, Decimal

from django.utils.formats import number_format

CENT = Decimal("0.01")


def euros(amount: Decimal | int) -> str:
    return f"€{number_format(Decimal(amount).quantize(CENT, ROUND_HALF_UP), 2)}"
