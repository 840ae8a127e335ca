"""The collector's fast writer of token list columns: Arrow writes the file with those columns null,
``splice`` appends their chunks written from the packed values (``gather_kernel``: numba) and edits the
footer (``thrift_compact``). Opted into by ``writer.write_parquet_atomic(splice_lists=True)`` only."""
