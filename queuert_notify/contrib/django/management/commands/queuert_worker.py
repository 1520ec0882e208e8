"""``python manage.py queuert_worker [--queue NAME ...] [--processes N] [--concurrency N]``."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from queuert_notify.errors import ConfigurationError
from queuert_notify.worker.supervisor import EXIT_JOBS_ABANDONED


class Command(BaseCommand):  # type: ignore[misc]
    help = (
        "Run the project's tasks of the queuert task backend until SIGTERM (a graceful "
        "drain: running tasks finish, a second signal cancels them)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            default=[],
            metavar="NAME",
            help="a task queue to run (repeatable; default: every queue of the backend)",
        )
        parser.add_argument("--processes", type=int, default=1, help="worker processes (default 1)")
        parser.add_argument(
            "--concurrency", type=int, default=10, help="tasks run at once per process"
        )
        parser.add_argument(
            "--backend", default="default", help="the TASKS alias (default 'default')"
        )
        parser.add_argument("--supervised", action="store_true", help=argparse.SUPPRESS)
        parser.add_argument(
            "--poll-interval",
            type=float,
            default=None,
            help="seconds between polls without a wakeup (default: OPTIONS poll_interval)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from queuert_notify.contrib.django.worker import backend_named, build_worker, run_worker

        processes: int = options["processes"]
        if processes < 1:
            raise CommandError(f"--processes must be >= 1, got {processes}")
        try:
            # Built in the supervisor too: a bad setting is one error, not N crashing children.
            worker, engine = build_worker(
                options["backend"],
                options["queues"],
                concurrency=options["concurrency"],
                poll_interval=options["poll_interval"],
            )
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        if processes > 1:
            asyncio.run(engine.dispose())
            sys.exit(self._supervise(processes, options))
        self.stdout.write(
            f"worker {worker.worker_id} running {', '.join(worker.type_names)} "
            f"(concurrency {worker.concurrency})"
        )
        try:
            settings = backend_named(options["backend"]).settings
            asyncio.run(run_worker(worker, engine, settings, supervised=options["supervised"]))
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        if worker.abandoned_jobs:
            self.stderr.write(
                f"stopped with {worker.abandoned_jobs} running tasks unfinished; they run "
                "again once their leases expire"
            )
            sys.exit(EXIT_JOBS_ABANDONED)

    def _supervise(self, processes: int, options: dict[str, Any]) -> int:
        from queuert_notify.worker.supervisor import Supervisor

        command = [
            sys.executable,
            os.path.abspath(sys.argv[0]),
            "queuert_worker",
            "--processes=1",
            "--supervised",
            f"--concurrency={options['concurrency']}",
            f"--backend={options['backend']}",
            *(f"--queue={queue}" for queue in options["queues"]),
        ]
        if options["poll_interval"] is not None:
            command.append(f"--poll-interval={options['poll_interval']}")
        self.stdout.write(f"supervising {processes} queuert worker processes")
        return asyncio.run(Supervisor(command, processes).run())
