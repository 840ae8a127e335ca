"""OTLP receiver (HTTP and gRPC) writing spans durably to partitioned Parquet."""
