from datetime import timedelta

from django.utils import timezone
from django.utils.crypto import constant_time_compare
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from desktops import crypto
from desktops.models import ApiKey

# last_used_at is a hint for the operator, not a log: refresh it at most this often.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer lb_<prefix>_<secret>`; the request acts as the key's creator."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode(errors="replace").split()
        if not header or header[0].lower() != self.keyword.lower():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Give the key as `Authorization: Bearer <key>`.")
        token = header[1]
        prefix = crypto.api_token_prefix(token)
        key = ApiKey.objects.select_related("created_by", "workspace").filter(prefix=prefix).first()
        if key is None or not constant_time_compare(key.hashed, crypto.api_token_hash(token)):
            raise exceptions.AuthenticationFailed("This API key is not valid.")
        now = timezone.now()
        if key.revoked_at is not None:
            raise exceptions.AuthenticationFailed("This API key was revoked.")
        if key.expires_at is not None and key.expires_at <= now:
            raise exceptions.AuthenticationFailed("This API key has expired.")
        if not key.created_by.is_active:
            raise exceptions.AuthenticationFailed("The owner of this API key is deactivated.")
        if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
            ApiKey.objects.filter(id=key.id).update(last_used_at=now)
        return key.created_by, key

    def authenticate_header(self, request):
        return self.keyword


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = ApiKeyAuthentication
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "A platform API key (`lb_…`)."}
