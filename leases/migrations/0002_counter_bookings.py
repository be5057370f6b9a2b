"""Counters written before bookings had entries get their ``holders`` list.

Run with the old code stopped: an old acquisition between its increment and its push
would otherwise be counted out.
"""

from django.db import migrations


def convert(apps, schema_editor):
    from leases.upkeep import sweeps

    sweeps.convert_legacy_counters()


class Migration(migrations.Migration):
    dependencies = [("leases", "0001_initial")]
    operations = [migrations.RunPython(convert, migrations.RunPython.noop)]
