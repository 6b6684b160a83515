# The LXC engine leases addresses from its own desktop records now (workers/drivers/lxc/state.py).

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("workers", "0001_ip_leases")]

    operations = [migrations.DeleteModel(name="IpLease")]
