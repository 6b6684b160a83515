"""How sign-up treats an address that an invitation link proved."""

from allauth.account.adapter import DefaultAccountAdapter

from desktops import selectors
from desktops.errors import NotFound

# The invitation link last opened signed out in this session: it proves its own address, nothing else.
INVITATION_LINK = "invitation_link"


def invitation_link_remember(request, token: str) -> None:
    request.session[INVITATION_LINK] = token


class AccountAdapter(DefaultAccountAdapter):
    # allauth makes a stashed address verified and primary on whatever account signs up next, whichever
    # address was typed (an invitation link would then fix the inviter's address on the victim's
    # account). Nothing is stashed: only the typed address is checked, against a link still valid.
    def unstash_verified_email(self, request):
        return None

    def is_email_verified(self, request, email: str) -> bool:
        token = request.session.get(INVITATION_LINK)
        if not token:
            return False
        try:
            invitation = selectors.invitation_by_token(token=token)
        except NotFound:
            return False  # expired, withdrawn or answered since
        return invitation.email.lower() == email.lower()
