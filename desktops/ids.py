"""Public ids: a short type prefix and random lowercase characters (`dsk_3k9…`), never row numbers."""

import secrets
import string
from functools import partial

from django.db import models

_ALPHABET = string.ascii_lowercase + string.digits
_LENGTH = 16


def new_id(prefix: str) -> str:
    return f"{prefix}_{''.join(secrets.choice(_ALPHABET) for _ in range(_LENGTH))}"


class PublicIdField(models.CharField):
    """Primary key holding a prefixed public id generated on insert."""

    def __init__(self, prefix: str, **kwargs):
        self.prefix = prefix
        kwargs.update(
            max_length=len(prefix) + 1 + _LENGTH,
            primary_key=True,
            editable=False,
            default=partial(new_id, prefix),
        )
        super().__init__(**kwargs)

    def deconstruct(self):
        name, path, _, _ = super().deconstruct()
        return name, path, [self.prefix], {}
