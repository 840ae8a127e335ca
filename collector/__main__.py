"""`python -m tinkertrace.collector`: the same as `tinkertrace collector`."""

import typer

from tinkertrace.cli.collector_cmd import collector

if __name__ == "__main__":
    typer.run(collector)
