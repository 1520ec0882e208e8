"""What "read back equal" means for JSON stored by the queue, and values to try it on."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from state_adapters.storable import JSON_INT_MAX, JSON_INT_MIN


def same_json(stored: Any, read_back: Any) -> bool:
    """Whether ``read_back`` is ``stored`` after a trip through a database.

    Tuples come back as lists. Numbers keep their value but not always their Python
    type: Postgres keeps JSON numbers as decimals, so a float with no fractional
    part (``1e23``, ``-0.0``) may come back as the int of the same value.
    """
    if isinstance(stored, bool) or isinstance(read_back, bool):
        return stored is read_back
    if isinstance(stored, int | float) and isinstance(read_back, int | float):
        if isinstance(stored, int) and isinstance(read_back, int):
            return stored == read_back
        return float(stored) == float(read_back)
    if isinstance(stored, dict):
        return (
            isinstance(read_back, dict)
            and stored.keys() == read_back.keys()
            and all(same_json(stored[key], read_back[key]) for key in stored)
        )
    if isinstance(stored, list | tuple):
        return (
            isinstance(read_back, list)
            and len(stored) == len(read_back)
            and all(same_json(a, b) for a, b in zip(stored, read_back, strict=True))
        )
    return type(stored) is type(read_back) and stored == read_back


any_text = st.text(st.characters(codec=None), max_size=40)
"""Any Python string: NUL, lone surrogates, control characters, emoji."""

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=2 * JSON_INT_MIN, max_value=2 * JSON_INT_MAX)
    | st.floats(allow_nan=True, allow_infinity=True)
    | any_text
)

any_json_like = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(any_text | st.integers(-3, 3), children, max_size=4)
    ),
    max_leaves=20,
)
"""JSON-shaped values, some of which a database cannot store (NaN, NUL, huge ints,
int keys, lone surrogates): the queue must refuse exactly those."""
