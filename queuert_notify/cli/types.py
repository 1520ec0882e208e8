"""``queuert-notify pause|resume|limits TYPE``: operate a job type, for every worker."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import click

from queuert_notify.cli.database import with_client, with_state
from queuert_notify.cli.options import (
    database_url_option,
    json_option,
    note_next_poll,
    redis_url_option,
    table_prefix_option,
)
from queuert_notify.cli.output import console, run, to_json

if TYPE_CHECKING:
    from state_adapters.model import TypeLimits
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)?")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class Duration(click.ParamType[timedelta]):
    """``500ms``, ``1s``, ``2m``, ``1h``, ``1d`` or plain seconds, as a ``timedelta``."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, timedelta):
            return value
        match = _DURATION.fullmatch(str(value).strip())
        if match is None:
            self.fail(f"{value!r} is not a duration such as 500ms, 1s, 2m, 1h or 1d", param, ctx)
        number, unit = match.groups()
        return timedelta(seconds=float(number) * _UNIT_SECONDS[unit or "s"])


@click.command()
@database_url_option
@table_prefix_option
@redis_url_option
@click.argument("type_name")
def pause(
    database_url: str, table_prefix: str, redis_url: str | None, redis_prefix: str, type_name: str
) -> None:
    """Stop every worker from claiming jobs of TYPE_NAME (running ones finish)."""
    notify = (redis_url, redis_prefix)
    run(with_client(database_url, table_prefix, notify, lambda c: c.pause_type(type_name)))
    note_next_poll(redis_url)
    console().print(f"paused {type_name}: no worker claims its jobs until `resume`")


@click.command()
@database_url_option
@table_prefix_option
@redis_url_option
@click.argument("type_name")
def resume(
    database_url: str, table_prefix: str, redis_url: str | None, redis_prefix: str, type_name: str
) -> None:
    """Let workers claim TYPE_NAME again (with --redis-url, idle ones wake at once)."""
    notify = (redis_url, redis_prefix)
    run(with_client(database_url, table_prefix, notify, lambda c: c.resume_type(type_name)))
    note_next_poll(redis_url)
    console().print(f"resumed {type_name}")


@click.command()
@database_url_option
@table_prefix_option
@redis_url_option
@click.argument("type_name")
@click.option("--concurrency", type=click.IntRange(1), help="Running jobs of the type at most.")
@click.option(
    "--key-concurrency", type=click.IntRange(1), help="Running jobs per concurrency key at most."
)
@click.option("--rate", type=click.IntRange(1), help="Jobs started per --per window at most.")
@click.option("--per", type=Duration(), help="The rate's window: 500ms, 1s, 1m, 1h, ...")
@click.option("--none", "lift", is_flag=True, help="Lift every limit of the type.")
@json_option
def limits(
    database_url: str,
    table_prefix: str,
    redis_url: str | None,
    redis_prefix: str,
    type_name: str,
    concurrency: int | None,
    key_concurrency: int | None,
    rate: int | None,
    per: timedelta | None,
    lift: bool,
    as_json: bool,
) -> None:
    """Show the limits of TYPE_NAME, or set them: the options given replace every limit
    (one not given is lifted), held across all workers and processes."""
    given = [v for v in (concurrency, key_concurrency, rate, per) if v is not None]
    if lift and given:
        raise click.UsageError("--none lifts every limit: give it alone")
    if given or lift:
        notify = (redis_url, redis_prefix)
        result = run(
            with_client(
                database_url,
                table_prefix,
                notify,
                lambda c: c.set_limits(
                    type_name,
                    concurrency=concurrency,
                    key_concurrency=key_concurrency,
                    rate=rate,
                    per=per,
                ),
            )
        )
        note_next_poll(redis_url)
    else:

        async def read(state: SqlAlchemyStateAdapter) -> TypeLimits:
            from state_adapters.model import TypeLimits

            found = [c for c in await state.type_controls() if c.type_name == type_name]
            return found[0] if found else TypeLimits(type_name)

        result = run(with_state(database_url, table_prefix, read))
    if as_json:
        click.echo(to_json(_as_dict(result)))
        return
    console().print(describe(result), highlight=False)


def describe(controls: TypeLimits) -> str:
    """One line: ``send-email: paused; concurrency 20, 100 per 1s``."""
    parts = []
    if controls.concurrency is not None:
        parts.append(f"concurrency {controls.concurrency}")
    if controls.key_concurrency is not None:
        parts.append(f"{controls.key_concurrency} per concurrency key")
    if controls.rate is not None:
        parts.append(f"{controls.rate} started per {controls.per_seconds:g}s")
    limits_text = ", ".join(parts) or "no limits"
    return f"{controls.type_name}: {'paused; ' if controls.paused else ''}{limits_text}"


def _as_dict(controls: TypeLimits) -> dict[str, Any]:
    return {
        "type_name": controls.type_name,
        "paused": controls.paused,
        "concurrency": controls.concurrency,
        "key_concurrency": controls.key_concurrency,
        "rate": controls.rate,
        "per_seconds": controls.per_seconds,
    }
