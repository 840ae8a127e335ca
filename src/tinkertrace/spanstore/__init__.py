"""Span storage shared by the collector, the embedded sink and the builder: OTLP → Arrow → Parquet."""

# zstd level 1: ~30% less CPU than the default (3) for the same size on token arrays (measured by
# benchmarks/collector_convert.py); compaction may rewrite with a higher level.
ZSTD_LEVEL = 1
ZSTD_LEVELS = (-131072, 22)  # what zstd accepts (pyarrow.Codec.minimum/maximum_compression_level)
