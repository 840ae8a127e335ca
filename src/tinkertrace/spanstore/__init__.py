"""Span storage shared by the collector, the embedded sink and the builder: OTLP → Arrow → Parquet."""
