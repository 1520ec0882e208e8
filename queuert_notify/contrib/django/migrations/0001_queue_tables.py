"""Creates the queue's tables (the queue's own migrations; see ``schema.py``). A
release of the queue that adds a migration of its own adds a Django migration running
the same step, so ``manage.py migrate`` after an upgrade brings the tables up to date."""

from django.db import migrations

from queuert_notify.contrib.django.schema import migrate_queue_tables


class Migration(migrations.Migration):  # type: ignore[misc]
    # The queue's migrations run on a connection of their own, in their own transaction.
    atomic = False
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [
        migrations.RunPython(migrate_queue_tables, migrations.RunPython.noop, elidable=False)
    ]
