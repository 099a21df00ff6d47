"""Results table, gateway-vs-nginx ratios, and the PASS/FAIL evaluation of the targets.

"Added latency" is target minus direct at the same mode and connection count: the cost of the
hop itself, with the backend's and the client's own time subtracted out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .payloads import STREAM_CHUNKS
from .wrk import WrkResult

MODES = ("non-stream", "stream")
TARGETS = ("direct", "nginx", "gateway")
TARGET_LABELS = {"direct": "direct (backend)", "nginx": "nginx hop", "gateway": "gateway"}

# The gateway's overhead budget (see docs/benchmarks/overhead.md).
MAX_ADDED_P50_MS = 1.0  # at 1 connection, non-stream
MIN_RPS_SHARE = 0.15  # of the nginx hop's req/s at 64 connections, non-stream
MIN_STREAMS_PER_S = 1500.0  # streams of 64 chunks at 64 connections


@dataclass
class Cell:
    """One measured (mode, connections, target) combination; ``error`` if it could not run."""

    mode: str
    connections: int
    target: str
    result: WrkResult | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.error_count == 0


@dataclass
class Target:
    name: str
    status: str  # PASS / FAIL / SKIP
    detail: str


class Results:
    """Indexes cells by (mode, connections, target) and derives the comparisons."""

    def __init__(self, cells: list[Cell]) -> None:
        self.cells = cells
        self._by_key = {(c.mode, c.connections, c.target): c for c in cells}

    def get(self, mode: str, conns: int, target: str) -> Cell | None:
        return self._by_key.get((mode, conns, target))

    def result(self, mode: str, conns: int, target: str) -> WrkResult | None:
        cell = self.get(mode, conns, target)
        return cell.result if cell else None

    def added(self, mode: str, conns: int, target: str) -> tuple[float, float] | None:
        """(added p50, added p99) in ms of ``target`` over direct, or None if not measured."""
        res, direct = self.result(mode, conns, target), self.result(mode, conns, "direct")
        if res is None or direct is None:
            return None
        return res.p50_ms - direct.p50_ms, res.p99_ms - direct.p99_ms

    def connections(self) -> list[int]:
        return sorted({c.connections for c in self.cells})

    def ratios(self) -> list[dict[str, Any]]:
        out = []
        for mode in MODES:
            for conns in self.connections():
                gw, hop = self.result(mode, conns, "gateway"), self.result(mode, conns, "nginx")
                gw_add, hop_add = (
                    self.added(mode, conns, "gateway"),
                    self.added(mode, conns, "nginx"),
                )
                if gw is None or hop is None:
                    continue
                out.append(
                    {
                        "mode": mode,
                        "connections": conns,
                        "gateway_rps_share_of_nginx": gw.rps / hop.rps if hop.rps else None,
                        "gateway_added_p50_ms": gw_add[0] if gw_add else None,
                        "nginx_added_p50_ms": hop_add[0] if hop_add else None,
                        "gateway_vs_nginx_added_p50": (
                            gw_add[0] / hop_add[0]
                            if gw_add and hop_add and hop_add[0] > 0
                            else None
                        ),
                    }
                )
        return out

    def targets(self) -> list[Target]:
        return [self._target_latency(), self._target_share(), self._target_streams()]

    def _gateway_cell(self, mode: str, conns: int, name: str) -> Cell | Target:
        cell = self.get(mode, conns, "gateway")
        if cell is None:
            return Target(name, "SKIP", f"gateway not measured at {mode}/{conns} conns")
        if cell.result is None:
            return Target(name, "FAIL", f"gateway run failed: {cell.error}")
        if cell.result.error_count:
            return Target(name, "FAIL", f"gateway returned errors: {cell.result.errors}")
        return cell

    def _target_latency(self) -> Target:
        name = f"gateway adds <= {MAX_ADDED_P50_MS:g} ms p50 at 1 connection (non-stream)"
        cell = self._gateway_cell("non-stream", 1, name)
        if isinstance(cell, Target):
            return cell
        added = self.added("non-stream", 1, "gateway")
        if added is None:
            return Target(name, "SKIP", "no direct baseline")
        status = "PASS" if added[0] <= MAX_ADDED_P50_MS else "FAIL"
        return Target(name, status, f"added p50 = {added[0]:.3f} ms")

    def _target_share(self) -> Target:
        pct = f"{MIN_RPS_SHARE:.0%}"
        name = f"gateway reaches >= {pct} of the nginx hop's req/s at 64 connections (non-stream)"
        cell = self._gateway_cell("non-stream", 64, name)
        if isinstance(cell, Target):
            return cell
        hop = self.result("non-stream", 64, "nginx")
        if hop is None or cell.result is None or not hop.rps:
            return Target(name, "SKIP", "no nginx hop baseline")
        share = cell.result.rps / hop.rps
        status = "PASS" if share >= MIN_RPS_SHARE else "FAIL"
        return Target(name, status, f"{cell.result.rps:,.0f} / {hop.rps:,.0f} req/s = {share:.1%}")

    def _target_streams(self) -> Target:
        name = (
            f"gateway relays >= {MIN_STREAMS_PER_S:,.0f} streams/s of {STREAM_CHUNKS} chunks "
            "at 64 connections"
        )
        cell = self._gateway_cell("stream", 64, name)
        if isinstance(cell, Target) or cell.result is None:
            return cell if isinstance(cell, Target) else Target(name, "SKIP", "no result")
        status = "PASS" if cell.result.rps >= MIN_STREAMS_PER_S else "FAIL"
        return Target(name, status, f"{cell.result.rps:,.0f} streams/s")


def _ms(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def markdown(results: Results) -> str:
    """The main table, the ratios table and the targets, as markdown."""
    lines = [
        f"| mode | conns | target | req/s | streams/s ({STREAM_CHUNKS} chunks) | p50 ms | p99 ms "
        "| added p50 ms | added p99 ms | errors |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for mode in MODES:
        for conns in results.connections():
            for target in TARGETS:
                cell = results.get(mode, conns, target)
                if cell is None:
                    continue
                label = TARGET_LABELS[target]
                res = cell.result
                if res is None:
                    lines.append(
                        f"| {mode} | {conns} | {label} | - | - | - | - | - | - "
                        f"| failed: {cell.error} |"
                    )
                    continue
                added = results.added(mode, conns, target) if target != "direct" else None
                streams = f"{res.rps:,.0f}" if mode == "stream" else ""
                errors = ", ".join(f"{k}={v}" for k, v in res.errors.items()) or "0"
                lines.append(
                    f"| {mode} | {conns} | {label} | {res.rps:,.0f} | {streams} "
                    f"| {_ms(res.p50_ms)} | {_ms(res.p99_ms)} "
                    f"| {_ms(added[0] if added else None, True)} "
                    f"| {_ms(added[1] if added else None, True)} | {errors} |"
                )
    ratios = results.ratios()
    if ratios:
        lines += [
            "",
            "| mode | conns | gateway req/s as share of nginx hop | gateway added p50 "
            "| nginx added p50 | gateway/nginx added p50 |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for r in ratios:
            share = r["gateway_rps_share_of_nginx"]
            factor = r["gateway_vs_nginx_added_p50"]
            lines.append(
                f"| {r['mode']} | {r['connections']} "
                f"| {'-' if share is None else f'{share:.1%}'} "
                f"| {_ms(r['gateway_added_p50_ms'], True)} ms "
                f"| {_ms(r['nginx_added_p50_ms'], True)} ms "
                f"| {'-' if factor is None else f'{factor:.1f}x'} |"
            )
    lines += ["", "Targets:", ""]
    lines += [f"- **{t.status}** {t.name}: {t.detail}" for t in results.targets()]
    return "\n".join(lines) + "\n"


def to_json(results: Results, meta: dict[str, Any]) -> dict[str, Any]:
    cells = []
    for c in results.cells:
        added = results.added(c.mode, c.connections, c.target) if c.target != "direct" else None
        cells.append(
            {
                "mode": c.mode,
                "connections": c.connections,
                "target": c.target,
                "error": c.error,
                "result": c.result.to_json() if c.result else None,
                "added_p50_ms": added[0] if added else None,
                "added_p99_ms": added[1] if added else None,
                "streams_per_s": c.result.rps if c.result and c.mode == "stream" else None,
            }
        )
    return {
        "meta": meta,
        "cells": cells,
        "ratios": results.ratios(),
        "targets": [vars(t) for t in results.targets()],
    }
