"""Chain and job ids: unique, time-ordered, and not repeated by a forked process."""

from __future__ import annotations

import os

import pytest

from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.errors import InvalidInputError
from state_adapters.ids import new_id
from state_adapters.validation import is_id


def test_ids_of_one_process_are_distinct_and_strictly_increasing() -> None:
    ids = [new_id() for _ in range(5000)]  # many per millisecond, several random refills
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert {len(i) for i in ids} == {32}


def test_a_forked_child_does_not_repeat_the_parents_ids() -> None:
    new_id()  # the parent has random bytes buffered for its next ids
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next ids and leave at once
        os.write(write, " ".join(new_id() for _ in range(50)).encode())
        os._exit(0)
    os.close(write)
    parents = {new_id() for _ in range(50)}
    with os.fdopen(read) as pipe:
        childs = set(pipe.read().split())
    os.waitpid(pid, 0)
    assert len(childs) == 50
    # Same millisecond and counter are possible; the random bits must differ.
    assert {i[-16:] for i in childs}.isdisjoint({i[-16:] for i in parents})


@pytest.mark.parametrize(
    "value",
    [
        "A" * 32,  # uppercase
        "a" * 31,
        "a" * 33,
        "g" + "a" * 31,
        "a" * 31 + "\n",
        " " + "a" * 31,
        "\u0663" * 32,  # a digit, but not an ASCII one
        "",
        None,
        0,
    ],
)
def test_a_chain_id_not_of_new_ids_form_is_refused_before_anything_is_written(
    value: object,
) -> None:
    assert not is_id(value)
    if isinstance(value, str):
        with pytest.raises(InvalidInputError, match="a new chain's id must be None or 32"):
            ChainSpec("t").to_new_chain(value)


def test_ids_of_new_id_have_the_form_a_new_chain_takes() -> None:
    ids = [new_id() for _ in range(1000)]
    assert all(is_id(i) for i in ids)
    assert {ChainSpec("t").to_new_chain(i).id for i in ids} == set(ids)
