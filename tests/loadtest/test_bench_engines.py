"""``--engine sim|llamacpp`` of the routing benches: arguments, engines and the policies written.

No engine is started: the llama-server command line is built with a stand-in binary and model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.config import parse_policy
from gateway.sim.profiles import PROFILES, get_profile
from loadtest.bench import engine_fleet, engine_shape, fairness_bench, prefix_bench, routing_bench
from loadtest.bench.engine_fleet import (
    EngineSpec,
    counters_from_text,
    ctx_per_slot,
    llama_server,
    pool_engine_keys,
    sim_command,
)

LLAMA_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 256
llamacpp:prompt_tokens_cached_total 14
llamacpp:prompt_seconds_total 0.0294
llamacpp:requests_processing 3
llamacpp:requests_deferred 2
"""

SIM_METRICS = """\
vllm:prompt_tokens_total{model_name="sim-model"} 1000.0
vllm:prefix_cache_hits_total{model_name="sim-model"} 600.0
vllm:prefix_cache_queries_total{model_name="sim-model"} 1000.0
vllm:num_requests_running{model_name="sim-model"} 2.0
"""


# --- the shared engine options ---------------------------------------------------------------


@pytest.mark.parametrize("bench", [prefix_bench, fairness_bench, routing_bench])
def test_every_bench_defaults_to_the_simulator(bench: Any) -> None:
    args = bench.parse_args([])
    assert args.engine == "sim"
    assert args.sim_profile is None
    assert (args.engine_threads, args.model_embedding, args.model_layers) == (1, 256, 4)
    assert pool_engine_keys(args) == {}


@pytest.mark.parametrize("bench", [prefix_bench, fairness_bench, routing_bench])
def test_every_bench_takes_llamacpp(bench: Any) -> None:
    args = bench.parse_args(["--engine", "llamacpp", "--engine-threads", "2",
                             "--model-layers", "2"])
    assert (args.engine, args.engine_threads, args.model_layers) == ("llamacpp", 2, 2)
    assert pool_engine_keys(args) == {"engine": "llamacpp"}
    assert pool_engine_keys(args, shared_cache=True) == {"engine": "llamacpp",
                                                         "cache_isolation": "shared"}


@pytest.mark.parametrize("bench", [prefix_bench, fairness_bench, routing_bench])
def test_an_unknown_engine_is_refused(bench: Any, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--engine", "vllm"])
    assert "invalid choice" in capsys.readouterr().err


def test_ctx_per_slot_rounds_up_with_a_margin() -> None:
    assert ctx_per_slot(100) == 256
    assert ctx_per_slot(192) == 256
    assert ctx_per_slot(193) == 512
    assert ctx_per_slot(1000, margin=128, multiple=512) == 1536


def test_sim_command_keeps_the_bench_flags_and_takes_a_profile() -> None:
    spec = EngineSpec(profile="batch", sim_args=("--no-prefix-caching",), sim_slots=8)
    cmd = sim_command(spec, 1234)
    assert cmd[1:] == ["-m", "gateway", "sim", "--profile", "batch", "--port", "1234",
                       "--queue-limit", "100000", "--no-prefix-caching", "--slots", "8"]
    assert "tiny-llamacpp" in sim_command(spec, 1234, "tiny-llamacpp")
    assert "--slots" not in sim_command(EngineSpec(), 1)


def test_llama_server_command_line(tmp_path: Path) -> None:
    args = prefix_bench.parse_args(["--engine", "llamacpp", "--engine-threads", "1"])
    spec = EngineSpec(slots=8, ctx_per_slot=768)
    server = llama_server(spec, args, tmp_path / "log", model=tmp_path / "m.gguf",
                          binary=tmp_path / "llama-server")
    cmd = server.args()
    assert cmd[0] == str(tmp_path / "llama-server")

    def flag(name: str) -> str:
        return str(cmd[cmd.index(name) + 1])

    assert (flag("-np"), flag("-c"), flag("-t"), flag("--alias")) == ("8", str(8 * 768), "1",
                                                                      "sim-model")
    assert flag("--threads-http") == "24"  # a thread per open connection: slots + 16
    assert flag("--cache-ram") == str(engine_fleet.CACHE_RAM_MIB)
    assert "--ignore-eos" in cmd and "--metrics" in cmd


def test_llamacpp_counters_are_read_in_vllm_names() -> None:
    got = counters_from_text(LLAMA_METRICS, "llamacpp")
    # llama.cpp's prompt_tokens_total excludes cached tokens: every prompt token is both
    assert got["vllm:prompt_tokens_total"] == 270
    assert got["vllm:prefix_cache_hits_total"] == 14
    assert got["vllm:prefix_cache_queries_total"] == 270
    assert got["llamacpp:prompt_seconds_total"] == pytest.approx(0.0294)
    assert sum(engine_fleet.parse_flat(LLAMA_METRICS, engine_fleet.LLAMA_LOAD).values()) == 5
    sim = counters_from_text(SIM_METRICS, "sim")
    assert sim == {"vllm:prompt_tokens_total": 1000.0, "vllm:prefix_cache_hits_total": 600.0,
                   "vllm:prefix_cache_queries_total": 1000.0}


# --- prefix_bench -----------------------------------------------------------------------------

URLS = ["http://127.0.0.1:1", "http://127.0.0.1:2"]


def test_prefix_policy_for_llamacpp_shares_the_cache_of_its_one_tenant() -> None:
    args = prefix_bench.parse_args(["--engine", "llamacpp", "--engines", "2"])
    keys = pool_engine_keys(args, shared_cache=True)
    for scenario in prefix_bench.SCENARIOS:
        data = prefix_bench.policy(scenario, URLS, 1.25, keys)
        pool = data["pools"][0]
        assert pool["engine"] == "llamacpp"
        assert pool["cache_isolation"] == "shared"  # else the gateway sends cache_prompt: false
        assert [b["url"] for b in pool["backends"]] == URLS
        parse_policy(data)
    sim = prefix_bench.policy("prefix", URLS, 1.25)["pools"][0]
    assert "engine" not in sim and "cache_isolation" not in sim
    assert sim["strategy"] == "prefix"


def test_prefix_engines_hold_the_longest_conversation() -> None:
    turns = [prefix_bench.Turn(at=i * 0.1, slot=i, user_tokens=100 + i, output_tokens=20)
             for i in range(40)]
    args = prefix_bench.parse_args(["--engine", "llamacpp", "--engines", "2",
                                    "--conversations", "2", "--system-tokens", "300"])
    specs = prefix_bench.engine_specs(args, turns)
    assert len(specs) == 2
    assert specs[0].slots == 32  # the interactive profile's running batch
    plan = prefix_bench.conversation_plan(turns, 2, args.seed, args.systems)
    longest = prefix_bench.longest_conversation(plan, 300)
    assert longest >= 300 + 3 * (100 + 20)  # at least 3 turns
    assert specs[0].ctx_per_slot >= longest + 128
    assert specs[0].sim_slots is None and "--kv-tokens" not in specs[0].sim_args
    calibrated = prefix_bench.engine_specs(prefix_bench.parse_args(
        ["--sim-profile", "tiny-llamacpp", "--slots", "16", "--conversations", "2"]), turns)
    assert calibrated[0].sim_slots == 16
    kv = calibrated[0].sim_args[calibrated[0].sim_args.index("--kv-tokens") + 1]
    assert int(kv) == 16 * calibrated[0].ctx_per_slot  # the llama-server's -c


def test_prefix_plan_is_the_same_for_every_scenario() -> None:
    turns = [prefix_bench.Turn(at=i * 0.1, slot=i, user_tokens=10, output_tokens=5)
             for i in range(30)]
    a = prefix_bench.conversation_plan(turns, 4, 7, 20)
    b = prefix_bench.conversation_plan(turns, 4, 7, 20)
    assert [(t.slot, c.system, tag) for t, c, tag in a] == [(t.slot, c.system, tag)
                                                           for t, c, tag in b]


# --- fairness_bench ---------------------------------------------------------------------------


def test_fairness_policy_for_llamacpp_keeps_the_default_isolation() -> None:
    args = fairness_bench.parse_args(["--engine", "llamacpp"])
    keys = pool_engine_keys(args)
    data = fairness_bench.policy(URLS, 16, True, 5.0, 2, True, True, None, keys)
    pool = data["pools"][0]
    assert pool["engine"] == "llamacpp"
    # no cache_isolation: the gateway sends cache_prompt: false, as the simulators run
    # --no-prefix-caching (the prompts are one word repeated)
    assert "cache_isolation" not in pool
    assert [b["max_in_flight"] for b in pool["backends"]] == [16, 16]
    parse_policy(data)
    assert "engine" not in fairness_bench.policy(URLS, 16, True, 5.0)["pools"][0]


def test_fairness_engines() -> None:
    args = fairness_bench.parse_args(["--engine", "llamacpp", "--engines", "2",
                                      "--prompt", "256", "--output", "64"])
    specs = fairness_bench.engine_specs(args)
    assert len(specs) == 2
    # 32 slots: more than max_in_flight 16 + fair_headroom 2, so the queue is the gateway's
    assert specs[0].slots == 32 > args.slots + args.headroom
    assert specs[0].ctx_per_slot >= 256 + 64 * 1.75  # the prompt and the longest output
    assert "--no-prefix-caching" in specs[0].sim_args
    assert "--speedup" in specs[0].sim_args and specs[0].sim_slots is None
    assert fairness_bench.engine_specs(fairness_bench.parse_args(
        ["--engine-slots", "20"]))[0].sim_slots == 20
    assert args.chosen[:2] == ["b-alone", "fair"]
    assert args.capacity is None
    assert fairness_bench.parse_args(["--capacity", "5.8"]).capacity == 5.8


# --- routing_bench ----------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", ["c-static", "a-class", "b-round-robin"])
def test_routing_policy_for_llamacpp_on_every_pool(scenario: str) -> None:
    args = routing_bench.parse_args(["--engine", "llamacpp"])
    data = routing_bench.policy(scenario, URLS[0], URLS[1], 8, 0.25, pool_engine_keys(args), 16)
    assert all(p["engine"] == "llamacpp" for p in data["pools"])
    assert all("cache_isolation" not in p for p in data["pools"])
    caps = {b["name"]: b["max_in_flight"] for p in data["pools"] for b in p["backends"]}
    assert caps == {"sim-i": 16, "sim-b": 8}
    parse_policy(data)
    sim = routing_bench.policy(scenario, URLS[0], URLS[1], 64, 0.25)
    assert all("engine" not in p for p in sim["pools"])
    assert {b["max_in_flight"] for p in sim["pools"] for b in p["backends"]
            if b["name"] == "sim-i"} == {32}


def test_routing_engines_follow_the_caps() -> None:
    args = routing_bench.parse_args(["--engine", "llamacpp", "--interactive-cap", "16",
                                     "--batch-cap", "8", "--max-context", "512",
                                     "--max-output", "32", "--batch-prompt", "128",
                                     "--batch-output", "64"])
    inter, batch = routing_bench.engine_specs(args)
    assert (inter.profile, inter.slots, batch.profile, batch.slots) == ("interactive", 16,
                                                                        "batch", 8)
    assert inter.ctx_per_slot >= 512 + 32 and batch.ctx_per_slot >= 128 + 64
    assert inter.sim_slots is None and batch.sim_slots is None  # the profiles' own batches
    same = routing_bench.engine_specs(routing_bench.parse_args(
        ["--sim-profile", "tiny-llamacpp", "--interactive-cap", "16", "--batch-cap", "8"]))
    assert [s.sim_slots for s in same] == [16, 8]


def test_routing_trace_is_scaled(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,1000,300\n"
                    "2023-11-16 18:15:47.6805900,50,10\n"
                    "2023-11-16 18:15:48.6805900,9000,2000\n")
    rows = routing_bench.read_trace(path, 60, 1.0, 512, 32, context_scale=0.1)
    assert [(r.context, r.generated) for r in rows] == [(100, 32), (16, 10), (512, 32)]
    assert [r.at for r in rows] == pytest.approx([0.0, 1.0, 2.0])
    full = routing_bench.read_trace(path, 60, 1.0, 8000, 1024)
    assert [r.context for r in full] == [1000, 50, 8000]


# --- the tiny-llamacpp profile and the shape fit ----------------------------------------------

# llama-server (tiny model e256/l4, -t 1), its CPU time: python -m loadtest.bench.engine_shape
MEASURED_TTFT_MS = {51: 12.2, 274: 36.7, 1041: 169.9, 2067: 427.5, 3089: 777.0}
MEASURED_STEP_MS = {1: 2.1, 4: 7.5, 16: 24.3, 32: 50.3}  # CPU per step less its prefills


def test_tiny_llamacpp_profile_reproduces_the_engine() -> None:
    p = get_profile("tiny-llamacpp")
    for tokens, ms in MEASURED_TTFT_MS.items():
        left, start, prefill = tokens, 0, 0.0
        while left:  # prompt chunks of at most step_tokens, each its own step
            k = min(left, p.step_tokens)
            prefill += p.step_cost_ms(0, 0, p.chunk_cost_ms(start, k))
            start, left = start + k, left - k
        assert p.request_overhead_ms + prefill == pytest.approx(ms, rel=0.25), tokens
    for n, ms in MEASURED_STEP_MS.items():
        assert p.step_cost_ms(n, n * 96, 0.0) == pytest.approx(ms, rel=0.2), n
    # the GPU profiles are left as they were calibrated
    assert (PROFILES["interactive"].step_ms, PROFILES["interactive"].per_seq_ms) == (6.5, 0.03)
    assert PROFILES["batch"].prefill_tokens_per_ms == 40.0


def test_shape_fit_recovers_the_constants() -> None:
    a, c, d, r, q, e = 0.7, 1.4, 1.2, 10.0, 5e-5, 6.0
    ttft = [{"prompt": n, "tokens": n, "ttft_ms": e + a + n / r + q * n * n,
             "cpu_ms": e + a + n / r + q * n * n} for n in (50, 300, 1000, 2000, 3000)]
    by_n = [{"streams": n, "prompt": 64, "tokens": 64,
             "tpot_ms": a + c * n + d * n * (64 + 32) / 1000} for n in (1, 2, 4, 8, 16)]
    by_ctx = [{"streams": 1, "prompt": t, "tokens": t,
               "tpot_ms": a + c + d * (t + 32) / 1000} for t in (64, 1024, 2048)]
    got = engine_shape.fit(ttft, by_n, by_ctx, 64)
    assert got["step_ms"] == pytest.approx(a, abs=1e-6)
    assert got["per_seq_ms"] == pytest.approx(c, rel=1e-6)
    assert got["per_kctx_ms"] == pytest.approx(d, rel=1e-6)
    assert got["prefill_tokens_per_ms"] == pytest.approx(r, rel=1e-6)
    assert got["attn_quadratic_ms"] == pytest.approx(q, rel=1e-6)
    assert got["request_overhead_ms"] == pytest.approx(e, rel=1e-6)
