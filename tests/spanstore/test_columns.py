"""The column names of ``schemas.columns`` are the spans schema's, with the types their use needs."""

from __future__ import annotations

import pyarrow as pa

from tinkertrace.schemas import spans
from tinkertrace.schemas.columns import (
    JSON_COLUMNS,
    SCALAR_ATTRIBUTES,
    TOKEN_ALIASES,
    TOKEN_ATTRIBUTES,
    TOKEN_COLUMNS,
)


def test_named_columns_exist_with_the_types_their_writers_expect() -> None:
    schema = spans()
    for name in TOKEN_COLUMNS:
        value_type = schema.field(name).type.value_type
        assert pa.types.is_int32(value_type) or pa.types.is_float32(value_type), name
    for name in JSON_COLUMNS:
        assert pa.types.is_string(schema.field(name).type) and not schema.field(name).nullable
    for column in SCALAR_ATTRIBUTES.values():
        assert schema.field(column).type in (pa.string(), pa.int32(), pa.int64(), pa.float64()), column
    assert sorted(TOKEN_ATTRIBUTES.values()) == sorted(TOKEN_COLUMNS)
    assert set(TOKEN_ALIASES.values()) <= set(TOKEN_ATTRIBUTES)
    lifted = [*SCALAR_ATTRIBUTES.values(), *TOKEN_ATTRIBUTES.values()]
    assert len(set(lifted)) == len(lifted)
