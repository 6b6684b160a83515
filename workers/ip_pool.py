"""Desktop addresses recorded in PostgreSQL: the unique constraint, not a lock, settles races."""

import ipaddress

from django.db import IntegrityError, transaction

from workers.drivers.base import DriverError
from workers.models import IpLease


class DatabaseIpAllocator:
    def __init__(self, subnet: str):
        self.network = ipaddress.IPv4Network(subnet)
        # The first address is the host's own end of the bridge.
        self.candidates = [str(ip) for ip in list(self.network.hosts())[1:]]

    def allocate(self, key: str) -> str:
        for _ in range(5):
            lease = IpLease.objects.filter(desktop_key=key).first()
            if lease is not None:
                return lease.address
            taken = set(IpLease.objects.filter(network=str(self.network)).values_list("address", flat=True))
            free = next((ip for ip in self.candidates if ip not in taken), None)
            if free is None:
                raise DriverError(f"No address is left on {self.network}: destroy a desktop first.")
            try:
                with transaction.atomic():
                    IpLease.objects.create(network=str(self.network), address=free, desktop_key=key)
                return free
            except IntegrityError:
                continue  # another worker took that address (or leased this key) first; look again
        raise DriverError(f"Could not lease an address on {self.network} after several tries.")

    def release(self, key: str) -> None:
        IpLease.objects.filter(desktop_key=key).delete()
