from django.db import models


class IpLease(models.Model):
    """One desktop's address on an engine's private network, so no two desktops ever share one."""

    network = models.CharField(max_length=43, help_text="The subnet, e.g. 10.213.0.0/24")
    address = models.GenericIPAddressField(protocol="IPv4")
    desktop_key = models.CharField(max_length=32, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["network", "address"], name="one_lease_per_address")]

    def __str__(self):
        return f"{self.address} -> {self.desktop_key}"
