"""``python -m queuert_notify.cli``: the ``queuert-notify`` command."""

from queuert_notify.cli import main

main()
