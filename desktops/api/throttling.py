"""Rate limits on the calls that cost the control plane or other people something (a command, the
screen, the agent, a relay, an e-mail): counted per person, all their keys and sessions together so that
more keys buy no more, and per desktop on the guest endpoint. Past a limit the answer is a 429 with
`Retry-After`. The rates are settings (`API_RATE_<SCOPE>`), counted in the shared cache, so every web
process counts the same calls."""

from rest_framework.permissions import SAFE_METHODS
from rest_framework.throttling import ScopedRateThrottle

from desktops.models import Desktop


class ActorRateThrottle(ScopedRateThrottle):
    """A view's `throttle_scope` limits each of its callers; `throttle_writes_only` leaves its reads
    (a page listing what the writes made) uncounted."""

    def get_cache_key(self, request, view):
        if getattr(view, "throttle_writes_only", False) and request.method in SAFE_METHODS:
            return None
        if isinstance(request.auth, Desktop):
            ident = f"desktop:{request.auth.id}"
        elif request.user is not None and request.user.is_authenticated:
            ident = f"user:{request.user.pk}"
        else:
            return None  # refused before this anyway
        return self.cache_format % {"scope": self.scope, "ident": ident}
