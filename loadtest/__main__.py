"""``python -m loadtest``."""

from __future__ import annotations

from loadtest.cli import main

raise SystemExit(main())
