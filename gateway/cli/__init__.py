"""The ``gateway`` command: ``serve``, ``check``, ``schema``, ``sim``, ``demo``, ``keys``,
``usage`` (``main``), each subcommand in its own module."""

from __future__ import annotations

from gateway.cli.main import main

__all__ = ["main"]
