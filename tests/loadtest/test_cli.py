"""The command line end to end: help, sweep -> JSON/PNG -> cost, compare, soak with drift."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gateway.sim.server import SimServer
from loadtest.cli import build_parser, main
from loadtest.soak import SoakRow, find_drift, parse_rss


def test_help_documents_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    """Every option of every subcommand has help text."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and "probe" in a.choices)
    assert set(sub.choices) == {"probe", "sweep", "cost", "replay", "compare", "engine"}
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{name} {action.option_strings} has no help"
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    assert "--soak-interval" in capsys.readouterr().out


def test_sweep_json_plot_then_cost(
    pool4: SimServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json, plots = tmp_path / "sweep.json", tmp_path / "plots"
    code = main(
        [
            "sweep",
            "--url",
            pool4.url,
            "--model",
            "m",
            "--levels",
            "1,2,4,8",
            "--requests",
            "16",
            "--max-tokens",
            "64",
            "--prompt-tokens",
            "100",
            "--pause",
            "0",
            "--no-progress",
            "--json",
            str(out_json),
            "--plot",
            str(plots),
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "lateau" in text and "out tok/s" in text  # found or not: plumbing only
    data = json.loads(out_json.read_text())
    assert [lv["concurrency"] for lv in data["levels"]] == [1, 2, 4, 8]
    assert data["levels"][0]["summary"]["requests"] == 16
    for name in ("throughput.png", "ttft.png", "tpot.png"):
        assert (plots / name).stat().st_size > 5_000
    code = main(
        [
            "cost",
            "--sweep",
            str(out_json),
            "--hardware-per-hour",
            "2.5",
            "--context-tokens",
            "100",
            "--output-tokens",
            "64",
            "--json",
            "-",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "30-day context (history) re-send" in printed
    est = json.loads(printed[printed.index('{\n  "inputs"') :])
    assert est["kind"] == "cost" and est["replicas"] == 1


def test_cost_example(capsys: pytest.CaptureFixture[str]) -> None:
    """The seed's worked example runs on the bundled sweep and prints the README's figures."""
    assert main(["cost", "--example"]) == 0
    out = capsys.readouterr().out
    for text in (
        "10,000 requests/day x 500 output tokens",
        "2,000-token context",
        "30-day output tokens: 150.0 M",
        "re-send: 600.0 M tokens",
        "30-day total tokens: 750.0 M",
        "Max concurrency the hardware holds",
        "Mean latency at the target throughput",
        "$2,300.00",
    ):
        assert text in out, text


def test_compare_two_endpoints(
    sim: SimServer, pool4: SimServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A (32 slots) vs B (4 slots): equal at low load, B falls behind past 4."""
    out_json = tmp_path / "cmp.json"
    code = main(
        [
            "compare",
            "--a-url",
            sim.url,
            "--a-model",
            "m",
            "--a-label",
            "wide",
            "--b-url",
            pool4.url,
            "--b-model",
            "m",
            "--b-label",
            "narrow",
            "--levels",
            "1,8",
            "--requests",
            "16",
            "--max-tokens",
            "32",
            "--prompt-tokens",
            "100",
            "--pause",
            "0",
            "--no-progress",
            "--json",
            str(out_json),
            "--plot",
            str(tmp_path),
        ]
    )
    assert code == 0
    assert "narrow - wide" in capsys.readouterr().out
    data = json.loads(out_json.read_text())
    _d1, d8 = data["deltas"]
    assert d8["ttft_ms"]["p50"] > 0  # B queues 4 of 8 requests
    assert (tmp_path / "throughput.png").exists()


class _Metrics(BaseHTTPRequestHandler):
    rss = [100e6]

    def do_GET(self) -> None:
        self.rss[0] *= 1.5  # a leak: +50% per scrape
        body = (
            "# TYPE process_resident_memory_bytes gauge\n"
            f"process_resident_memory_bytes {self.rss[0]:.0f}\n"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def leaky_metrics() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()


def test_soak_flags_memory_drift(
    sim: SimServer, leaky_metrics: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "soak.json"
    code = main(
        [
            "sweep",
            "--url",
            sim.url,
            "--model",
            "m",
            "--soak",
            "2.1s",
            "--soak-interval",
            "0.7s",
            "--soak-level",
            "2",
            "--max-tokens",
            "16",
            "--prompt-tokens",
            "100",
            "--metrics-url",
            leaky_metrics,
            "--no-progress",
            "--json",
            str(out_json),
        ]
    )
    assert code == 0
    assert "Drift detected" in capsys.readouterr().out
    rows = json.loads(out_json.read_text())["rows"]
    assert len(rows) == 3 and rows[0]["drift"] == []
    assert any("memory" in d for d in rows[1]["drift"])
    assert rows[0]["requests"] > 0


def test_parse_rss_and_drift_rules() -> None:
    text = (
        'process_resident_memory_bytes{pid="1"} 1.0e6\n'
        'process_resident_memory_bytes_total 9\nprocess_resident_memory_bytes{pid="2"} 2e6\n'
    )
    assert parse_rss(text) == 3e6 and parse_rss("x 1") is None
    first = SoakRow(
        t_s=60,
        requests=10,
        output_tps=1000,
        ttft_p99_ms=100,
        errors=0,
        rss_bytes=1e9,
        client_cpu=0.1,
    )
    same = SoakRow(
        t_s=120,
        requests=10,
        output_tps=900,
        ttft_p99_ms=115,
        errors=0,
        rss_bytes=1.1e9,
        client_cpu=0.1,
    )
    worse = SoakRow(
        t_s=180,
        requests=10,
        output_tps=700,
        ttft_p99_ms=130,
        errors=2,
        rss_bytes=1.3e9,
        client_cpu=0.1,
    )
    assert find_drift(first, same) == []
    assert len(find_drift(first, worse)) == 4
