"""One checkout's side of ``django-enqueue --baseline``, run as a script with that
checkout as the working directory, so Django, the queue and the benchmark's own
``_setup`` and ``_variant`` are that checkout's (a baseline's too: it needs no copy of
this file). Arguments: the Postgres database (made by the parent), the Redis and
Postgres URLs, and ``psycopg2`` to hide psycopg 3 from the process, so Django's Postgres
backend runs on psycopg2 (as where psycopg 3 is not installed). Prints ``ready``, then
for each request line (JSON: ``alias``, ``batch_statement``, ``transactions``) runs one
round and prints its figures (JSON).
"""

from __future__ import annotations

import os
import sys

# The checkout under test, not this file's folder, is where the packages come from.
sys.path[0] = os.getcwd()
if sys.argv[4:] == ["psycopg2"]:
    sys.modules["psycopg"] = None  # type: ignore[assignment]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from sqlalchemy.engine import make_url  # noqa: E402

from benchmarks import django_enqueue  # noqa: E402


def main() -> None:
    database, redis_url, postgres_url = sys.argv[1:4]
    args = argparse.Namespace(redis_url=redis_url, pg=make_url(postgres_url))
    django_enqueue._setup(args, database, Path(tempfile.mkdtemp()))
    loop = asyncio.new_event_loop()
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        variant = django_enqueue._variant(
            request["alias"],
            "",
            request["transactions"],
            batch_statement=request["batch_statement"],
        )
        print(json.dumps(loop.run_until_complete(variant.run())), flush=True)


if __name__ == "__main__":
    main()
