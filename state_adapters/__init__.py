"""Job state in the application's own SQL database, through SQLAlchemy.

``SqlAlchemyStateAdapter`` is the adapter; ``metadata`` holds its tables under
the default prefix, ``make_metadata(prefix, schema)`` under any other.
"""

from state_adapters.schema import make_metadata, metadata
from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

__all__ = ["SqlAlchemyStateAdapter", "make_metadata", "metadata"]
