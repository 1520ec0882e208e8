"""The same tests run on SQLite + in-process and on Postgres + Redis."""

import pytest
from signup_app import HANDLERS, OUTBOX, User, sign_up
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from queuert_notify.testing import run_until_idle


@pytest.fixture(autouse=True)
def outbox():
    OUTBOX.clear()
    return OUTBOX


async def test_signing_up_sends_the_welcome_mail(engine, client, outbox):
    chain_id = await sign_up(engine, client, "ada@example.com")

    assert await run_until_idle(client, HANDLERS) == 2  # send-welcome, record-welcome
    assert outbox == ["ada@example.com"]
    chain = await client.get_chain(chain_id)
    assert (chain.status, chain.output) == ("completed", {"welcomed": "ada@example.com"})


async def test_a_sign_up_that_rolls_back_sends_nothing(engine, client, outbox):
    # The same address as the test above: it passes only because each test starts
    # from empty tables.
    await sign_up(engine, client, "ada@example.com")
    with pytest.raises(IntegrityError):
        await sign_up(engine, client, "ada@example.com")

    assert await run_until_idle(client, HANDLERS) == 2  # the first sign-up's jobs only
    assert outbox == ["ada@example.com"]
    async with engine.connect() as conn:
        assert await conn.scalar(select(func.count()).select_from(User)) == 1


async def test_a_mail_scheduled_for_later_is_not_sent_now(engine, client, outbox):
    await client.start_chain("send-welcome", {"to": "bob@example.com"}, delay=3600)

    assert await run_until_idle(client, HANDLERS) == 0  # not due: not run, not waited for
    assert outbox == []
