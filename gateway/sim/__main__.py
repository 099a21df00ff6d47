"""``python -m gateway.sim``: the simulator without the gateway's CLI."""

from __future__ import annotations

import argparse
import sys

from gateway.sim.cli import add_arguments, main

__all__: list[str] = []

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m gateway.sim")
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
