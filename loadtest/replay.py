"""Open-loop replay of a trace (:func:`run_replay`): requests leave on the trace's schedule.

Each row becomes a request at ``offset / speedup`` seconds after the start, whether or not earlier
ones finished (open loop: a slow target builds a queue, as real users would). The prompt is
synthesised to ``ContextTokens`` (common words, ~1 token each, led by the request number so no two
share a prefix) and ``max_tokens`` is ``GeneratedTokens`` (capped by ``max_output``). A seeded
``batch_share`` of requests is sent as the batch class (``X-Request-Class: batch``, and
``batch_model`` when given).

**Sessions** (``sessions = TURNS``): rows are dealt into ``ceil(rows / TURNS)`` conversations,
conversation ``j`` taking rows ``j, j + M, j + 2M, ...`` (M conversations), so its turns are
spread over the trace. A turn sends the whole history (every earlier prompt and the reply text
received) plus its own new prompt, so input grows turn by turn; a turn cannot leave before the
previous reply has arrived, so its send time is ``max(schedule, previous reply)``.

**Arrival accuracy**: lag = actual send time - due time (the schedule, or the previous reply in a
session when later); a large lag means the client, not the target, shaped the load.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from loadtest.client import Client, RequestSpec, Result, Target, build_body, synth_prompt
from loadtest.monitor import SelfMonitor, SelfReport
from loadtest.stats import Summary, pcts, summarize
from loadtest.trace import TraceRow

__all__ = [
    "ClassReport",
    "Planned",
    "ReplayPlan",
    "ReplayResult",
    "parse_targets",
    "plan_requests",
    "run_replay",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayPlan:
    speedup: float = 1.0
    max_output: int | None = None
    batch_share: float = 0.0
    batch_model: str | None = None
    sessions: int = 0  # turns per conversation; 0 = independent requests
    ttft_targets: dict[str, float] = field(default_factory=dict)  # class -> seconds
    seed: int = 0
    timeout: float = 300.0
    max_connections: int = 1024
    ignore_eos: bool = False


@dataclass(frozen=True, slots=True)
class Planned:
    """One request of the schedule."""

    index: int
    at_s: float
    klass: str
    context_tokens: int
    max_tokens: int
    conversation: int = -1
    turn: int = 0


@dataclass(slots=True, kw_only=True)
class ClassReport:
    klass: str
    summary: Summary
    ttft_target_s: float | None
    attainment: float | None  # share of requests (errors count as misses) within the target


@dataclass(slots=True, kw_only=True)
class ReplayResult:
    target: dict[str, str]
    plan: dict[str, Any]
    rows: int
    wall_s: float
    classes: list[ClassReport]
    lag_ms: dict[str, float]
    lag_max_ms: float
    input_tokens: int
    history_tokens: int
    client: SelfReport
    timeline: list[dict[str, Any]]

    @property
    def warning(self) -> str | None:
        if self.lag_ms.get("p99", 0.0) > 50.0:
            return (
                f"replay lagged its schedule (p99 {self.lag_ms['p99']:.0f} ms): the client may "
                "have shaped the load; lower --speedup"
            )
        return self.client.warning

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "replay",
            "target": self.target,
            "plan": self.plan,
            "rows": self.rows,
            "wall_s": self.wall_s,
            "classes": [
                {
                    "class": c.klass,
                    "summary": c.summary.to_dict(),
                    "ttft_target_s": c.ttft_target_s,
                    "attainment": c.attainment,
                }
                for c in self.classes
            ],
            "lag_ms": self.lag_ms,
            "lag_max_ms": self.lag_max_ms,
            "input_tokens": self.input_tokens,
            "history_tokens": self.history_tokens,
            "client": asdict(self.client),
            "warning": self.warning,
            "timeline": self.timeline,
        }


def _duration(text: str) -> float:
    text = text.strip().lower()
    if text.endswith("ms"):
        return float(text[:-2]) / 1000
    if text.endswith("s"):
        return float(text[:-1])
    return float(text)


def parse_targets(text: str) -> dict[str, float]:
    """``interactive=500ms,batch=5s`` -> ``{"interactive": 0.5, "batch": 5.0}``."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        if not eq:
            raise ValueError(f"TTFT target {part!r} is not CLASS=DURATION (e.g. batch=5s)")
        out[name.strip()] = _duration(value)
    return out


def plan_requests(rows: list[TraceRow], plan: ReplayPlan) -> list[Planned]:
    """The schedule (pure): due times, classes, lengths and conversation turns."""
    rng = random.Random(plan.seed)
    cap = plan.max_output or math.inf
    n = len(rows)
    turns = plan.sessions
    convs = math.ceil(n / turns) if turns > 0 else 0
    conv_class = [
        ("batch" if rng.random() < plan.batch_share else "interactive") for _ in range(convs)
    ]
    out = []
    for i, row in enumerate(rows):
        if turns > 0:
            conv, turn = i % convs, i // convs
            klass = conv_class[conv]
        else:
            conv, turn = -1, 0
            klass = "batch" if rng.random() < plan.batch_share else "interactive"
        out.append(
            Planned(
                index=i,
                at_s=row.offset_s / plan.speedup,
                klass=klass,
                context_tokens=max(1, row.context_tokens),
                max_tokens=int(max(1, min(row.generated_tokens, cap))),
                conversation=conv,
                turn=turn,
            )
        )
    return out


class _Replayer:
    """Runs one schedule; per run, not shared."""

    def __init__(
        self,
        client: Client,
        target: Target,
        plan: ReplayPlan,
        on_result: Callable[[Result], None] | None,
    ) -> None:
        self.client = client
        self.target = target
        self.plan = plan
        self.on_result = on_result
        self.results: list[Result] = []
        self.history_tokens = 0
        self.t0 = 0
        self._headers = {
            "interactive": target.headers(),
            "batch": target.headers({"X-Request-Class": "batch"}),
        }

    def spec(self, p: Planned, messages: list[dict[str, str]]) -> RequestSpec:
        model = self.target.model
        if p.klass == "batch" and self.plan.batch_model:
            model = self.plan.batch_model
        body = build_body(model, messages, p.max_tokens, ignore_eos=self.plan.ignore_eos)
        return RequestSpec(
            url=self.target.chat_url,
            headers=self._headers[p.klass],
            body=body,
            max_tokens=p.max_tokens,
            klass=p.klass,
        )

    async def wait_until(self, at_s: float) -> None:
        delay = (self.t0 + int(at_s * 1e9) - time.perf_counter_ns()) / 1e9
        if delay > 0:
            await asyncio.sleep(delay)

    async def send(
        self, p: Planned, spec: RequestSpec, due_ns: int, keep_text: bool = False
    ) -> Result:
        res = await self.client.send(spec, keep_text=keep_text)
        res.tag = p.index
        res.meta = {"at_s": p.at_s, "lag_ms": (res.start_ns - due_ns) / 1e6}
        self.results.append(res)
        if self.on_result is not None:
            self.on_result(res)
        return res

    async def independent(self, schedule: list[Planned]) -> None:
        tasks = []
        for p in schedule:
            content = synth_prompt(p.context_tokens, f"#{p.index}")
            spec = self.spec(p, [{"role": "user", "content": content}])
            await self.wait_until(p.at_s)
            due = self.t0 + int(p.at_s * 1e9)
            tasks.append(asyncio.create_task(self.send(p, spec, due)))
        await asyncio.gather(*tasks)

    async def conversation(self, turns: list[Planned]) -> None:
        history: list[dict[str, str]] = []
        history_tokens = 0
        prev_done = 0
        for p in turns:
            content = synth_prompt(p.context_tokens, f"#{p.index}")
            messages = [*history, {"role": "user", "content": content}]
            spec = self.spec(p, messages)
            await self.wait_until(p.at_s)
            due = max(self.t0 + int(p.at_s * 1e9), prev_done)
            res = await self.send(p, spec, due, keep_text=True)
            self.history_tokens += history_tokens
            prev_done = res.end_ns
            reply = res.text or ""
            history += [
                {"role": "user", "content": content},
                {"role": "assistant", "content": reply},
            ]
            history_tokens += p.context_tokens + res.output_tokens

    async def run(self, schedule: list[Planned]) -> None:
        self.t0 = time.perf_counter_ns() + 50_000_000  # 50 ms to get going
        if self.plan.sessions <= 0:
            await self.independent(schedule)
            return
        convs: dict[int, list[Planned]] = {}
        for p in schedule:
            convs.setdefault(p.conversation, []).append(p)
        await asyncio.gather(*(self.conversation(turns) for turns in convs.values()))


def _class_reports(
    results: list[Result], wall_s: float, targets: dict[str, float]
) -> list[ClassReport]:
    out = []
    for klass in sorted({r.klass for r in results}):
        mine = [r for r in results if r.klass == klass]
        goal = targets.get(klass)
        attained = None
        if goal is not None and mine:
            hits = sum(1 for r in mine if r.ok and r.ttft_s is not None and r.ttft_s <= goal)
            attained = hits / len(mine)
        out.append(
            ClassReport(
                klass=klass,
                summary=summarize(mine, wall_s),
                ttft_target_s=goal,
                attainment=attained,
            )
        )
    return out


async def run_replay(
    target: Target,
    rows: list[TraceRow],
    plan: ReplayPlan,
    *,
    on_result: Callable[[Result], None] | None = None,
) -> ReplayResult:
    """Replay ``rows`` against ``target`` and report per class and on arrival accuracy."""
    schedule = plan_requests(rows, plan)
    mon = SelfMonitor()
    mon.start()
    async with Client(plan.max_connections, timeout=plan.timeout) as client:
        rep = _Replayer(client, target, plan, on_result)
        await rep.run(schedule)
    client_report = mon.report()
    await mon.stop()
    results = sorted(rep.results, key=lambda r: r.tag)
    wall = (max((r.end_ns for r in results), default=rep.t0) - rep.t0) / 1e9
    lags = [r.meta["lag_ms"] for r in results]
    timeline = [
        {
            "at_s": round((r.start_ns - rep.t0) / 1e9, 4),
            "due_s": r.meta["at_s"],
            "class": r.klass,
            "ttft_ms": round(r.ttft_s * 1e3, 3) if r.ttft_s is not None else None,
            "error": r.error,
        }
        for r in results
    ]
    return ReplayResult(
        target={"url": target.url, "model": target.model},
        plan=asdict(plan),
        rows=len(rows),
        wall_s=wall,
        classes=_class_reports(results, wall, plan.ttft_targets),
        lag_ms=pcts(lags),
        lag_max_ms=max(lags, default=0.0),
        input_tokens=sum(r.prompt_tokens or 0 for r in results),
        history_tokens=rep.history_tokens,
        client=client_report,
        timeline=timeline,
    )
