"""Rollout state in this process, kept across restarts in ``<data_dir>/rollouts.json``.

The embedded default (no Redis): this process is the only replica, so it always holds the
lease and its counts are all there are. The file is rewritten (a temporary file, fsync'd,
then renamed over the old one) on every transition - a few times per step, never per
request - in a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

from gateway.rollouts.machine import RolloutState

__all__ = ["FILE_NAME", "MemoryRolloutStore"]

FILE_NAME = "rollouts.json"
_log = logging.getLogger("gateway.rollouts")


class MemoryRolloutStore:
    """States in a dict (and a JSON file when ``path`` is given), counts of this replica."""

    kind = "memory"

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._states: dict[str, RolloutState] = {}
        self._windows: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
        if path is not None and path.exists():
            try:
                data = json.loads(path.read_text())
                self._states = {m: RolloutState.from_json(s) for m, s in data.items()}
            except (OSError, ValueError, TypeError, KeyError) as exc:
                _log.error("rollouts: cannot read %s (%s); starting without saved state",
                           path, exc)

    def __repr__(self) -> str:
        return f"<MemoryRolloutStore {self.path or 'in-process'} [rollouts: {len(self._states)}]>"

    async def load(self, model: str) -> RolloutState | None:
        return self._states.get(model)

    async def save(self, state: RolloutState, expected: int | None) -> bool:
        current = self._states.get(state.model)
        if (current.revision if current is not None else None) != expected:
            return False
        self._states[state.model] = state
        await self._write()
        return True

    async def publish(self, model: str, epoch: int, replica: str, window: dict[str, Any],
                      ttl: float) -> None:
        for key in [k for k in self._windows if k[0] == model and k[1] != epoch]:
            del self._windows[key]  # windows of past steps
        self._windows.setdefault((model, epoch), {})[replica] = window

    async def gather(self, model: str, epoch: int) -> list[dict[str, Any]]:
        return list(self._windows.get((model, epoch), {}).values())

    async def lead(self, replica: str, ttl: float) -> bool:
        return True

    async def resign(self, replica: str) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def _write(self) -> None:
        if self.path is None:
            return
        text = json.dumps({m: s.to_json() for m, s in self._states.items()}, indent=1)
        await asyncio.to_thread(_replace, self.path, text)


def _replace(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
