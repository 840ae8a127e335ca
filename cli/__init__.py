"""The `tinkertrace` command line."""
