"""Runs the queue's migration 0011: on SQLite, the tables whose JSON columns were
declared ``JSON`` are rebuilt with ``TEXT`` columns (a job's input that is a bare number
then reads back as given); nothing to do on Postgres."""

from django.db import migrations

from queuert_notify.contrib.django.schema import migrate_queue_tables


class Migration(migrations.Migration):  # type: ignore[misc]
    # The queue's migrations run on a connection of their own, in their own transaction.
    atomic = False
    dependencies = [("queuert_notify", "0001_queue_tables")]
    operations = [
        migrations.RunPython(migrate_queue_tables, migrations.RunPython.noop, elidable=False)
    ]
