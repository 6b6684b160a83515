from rest_framework import permissions

from desktops.models import ApiKey, ApiScope


class IsAuthenticatedWithScope(permissions.IsAuthenticated):
    """Signed in (session or key), and a read-scoped key only reads; roles are checked by the services."""

    message = "This API key is read-only."

    def has_permission(self, request, view):
        if not super().has_permission(request, view):
            return False
        key = request.auth
        return not (
            isinstance(key, ApiKey)
            and key.scope == ApiScope.READ
            and request.method not in permissions.SAFE_METHODS
        )
