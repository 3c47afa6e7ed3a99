"""Load from many machines: Locust users that replay the lab's workloads over HTTP, GA WebSocket and the
long-lived protocol, with the lab's metric definitions (proto/lab/analysis/metrics.py: TTFT = send → first
token-bearing delta, E2E = first send → last terminal event, turn overhead = TTFT − the prefill and queue
wait the server reports for that turn).

One machine (a local runner):

    locust -f scripts/locustfile.py --headless -u 6 -r 6 -t 60s --host http://127.0.0.1:8000

Many (Locust's distributed mode; every worker runs the same file, the master merges):

    locust -f scripts/locustfile.py --master --headless --expect-workers 2 -u 6 -r 6 -t 60s --host http://…
    locust -f scripts/locustfile.py --worker --master-host MASTER    # on each load machine, as many as cores

A fleet without a load balancer: ``--rl-hosts URL1,URL2,…`` (each user keeps one of them; ``--host`` is
then only Locust's label). Users (pick with class names on the command line, default all three, equally
weighted): ``HttpRollout``
(``--rl-http-mode http``: the whole history re-sent; ``http-prev``: chained), ``GaWebSocketRollout`` (one
connection, ``previous_response_id`` per turn), ``LongLivedRollout`` (one response, an append per tool
turn). Each user runs one rollout after another on its own connection, like a lab session. Workload and
model: ``--rl-workload`` (a bundled name or a file, as ``bench --workload``), ``--rl-model``, ``--rl-turns``,
``--rl-tool-time-scale`` (the client's tool waits: the workload's recorded times, slept), ``--rl-api-key``.

Locust's own table shows each metric as a request type (``TTFT``/``E2E``/``OVERHEAD``, one name per mode;
its percentiles are Locust's: whole milliseconds below 100 ms, two significant digits above). The exact
figures — every sample, shipped from the workers to the master in their reports — are printed at the end
and written to ``--rl-out`` (JSON): per mode, n, p50/p90/p99 of TTFT, E2E and overhead, errors.

The processes are gevent's: a socket waits cooperatively; one worker uses at most one core, so run one
worker per load-machine core. Loopback or your own hosts only.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import gevent
import requests
import websocket
from locust import User, between, events, task
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

from proto.client import messages
from proto.client.frames import decode, encode
from proto.client.messages import function_calls
from proto.client.sse import SseParser
from proto.core.events import TERMINAL_TYPES
from proto.lab.analysis.metrics import SEND, Mark, Trace, percentile, rollout_metrics
from proto.lab.run.clients import answer
from proto.lab.workload.plan import RolloutPlan, Send, build_plan
from proto.lab.workload.traces import Session, load_replay

METRICS = ("TTFT", "E2E", "OVERHEAD")
# mode -> metric -> samples (ms). On a worker: those not yet reported; on the master or a local run: all.
SAMPLES: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
ERRORS: dict[str, int] = defaultdict(int)


@events.init_command_line_parser.add_listener
def _arguments(parser: Any) -> None:
    parser.add_argument(
        "--rl-workload", default="coding-agent", help="workload NAME or FILE (as bench --workload)"
    )
    parser.add_argument("--rl-model", default="mock-1000tps")
    parser.add_argument("--rl-turns", type=int, default=0, help="shorten the workload to N turns (0: all)")
    parser.add_argument("--rl-tool-time-scale", type=float, default=1.0)
    parser.add_argument("--rl-http-mode", default="http", choices=["http", "http-prev"])
    parser.add_argument("--rl-api-key", default="")
    parser.add_argument(
        "--rl-hosts",
        default="",
        help="comma list of API servers: users take them in turn (instead of --host)",
    )
    parser.add_argument("--rl-out", default="", help="write the exact figures here (JSON), on the master")


_WORKLOADS: dict[tuple[str, int], Session] = {}
_USERS = itertools.count()  # users started in this process: with --rl-hosts, user k takes host k mod n


def _plan(environment: Environment) -> RolloutPlan:
    """A fresh plan per rollout (a new nonce: no two rollouts share a KV prefix), as the lab builds it."""
    options = environment.parsed_options
    key = (options.rl_workload, options.rl_turns)
    if key not in _WORKLOADS:
        _WORKLOADS[key] = load_replay(options.rl_workload).shortened(options.rl_turns or None).sessions[0]
    nonce = f"{uuid.uuid4().int % 10**12:012d}"
    return build_plan(_WORKLOADS[key], options.rl_model, nonce, options.rl_tool_time_scale)


def _answers_for(plan: RolloutPlan, turn: int) -> Send:
    """What the client sends after turn ``turn``'s calls: the plan's next round (its outputs and tool
    wait)."""
    if turn + 1 >= len(plan.sends):
        raise RuntimeError(
            f"the model called tools at turn {turn}; the workload has {len(plan.sends) - 1} tool turns"
        )
    return plan.sends[turn + 1]


class _Rollouts(User):
    abstract = True
    wait_time = between(0, 0)  # rollouts back to back, as a lab session runs them
    mode = ""

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.headers = {"Authorization": f"Bearer {options.rl_api_key}"} if options.rl_api_key else {}
        hosts = [h for h in options.rl_hosts.split(",") if h]
        if hosts:  # a fleet without a load balancer in front: each user keeps one server
            self.host = hosts[next(_USERS) % len(hosts)]

    def run_rollout(self, plan: RolloutPlan, trace: Trace) -> None:
        raise NotImplementedError

    @task
    def rollout(self) -> None:
        trace = Trace(self.mode)
        plan = _plan(self.environment)
        started = time.perf_counter()
        try:
            self.run_rollout(plan, trace)
            metrics = rollout_metrics(trace)
        except Exception as exc:  # any failure is one failed rollout, counted and shown
            ERRORS[self.mode] += 1
            self.environment.events.request.fire(
                request_type="E2E",
                name=self.mode,
                response_time=(time.perf_counter() - started) * 1e3,
                response_length=0,
                exception=exc,
                context={},
            )
            self.reconnect()
            return
        fire = self.environment.events.request.fire
        for turn in metrics.turns:
            for metric, value in (("TTFT", turn.ttft_ms), ("OVERHEAD", turn.overhead_ms)):
                SAMPLES[self.mode][metric].append(value)
                # Locust's histogram takes no negative time; the exact figures keep the sign.
                fire(
                    request_type=metric,
                    name=self.mode,
                    response_time=max(value, 0.0),
                    response_length=0,
                    exception=None,
                    context={},
                )
        SAMPLES[self.mode]["E2E"].append(metrics.e2e_s * 1e3)
        fire(
            request_type="E2E",
            name=self.mode,
            response_time=metrics.e2e_s * 1e3,
            response_length=len(metrics.turns),
            exception=None,
            context={},
        )

    def reconnect(self) -> None:
        """After a failure: start the next rollout on a fresh connection."""

    def exchange(self, body: dict[str, Any], trace: Trace) -> dict[str, Any]:
        """One turn of a request/response transport: ``body`` sent, its terminal response back."""
        raise NotImplementedError

    def chained(self, plan: RolloutPlan, trace: Trace, previous: bool) -> None:
        """A rollout of one response per turn, as the lab's chained clients run it: ``previous`` chains with
        ``previous_response_id`` and the new items, else the whole history is re-sent."""
        base = plan.request()
        history: list[Any] = list(base["input"])
        body: dict[str, Any] = base
        for turn in range(plan.turns):
            response = self.exchange(body, trace)
            trace.add_response(response)
            calls = function_calls(response)
            if response.get("status") != "completed" or not calls:
                return
            send = _answers_for(plan, turn)
            gevent.sleep(send.wait_s)
            new_items = answer(calls, send)
            history = [*history, *response["output"], *new_items]
            body = (
                messages.continuation(base, new_items, response["id"])
                if previous
                else dict(base, input=history)
            )
        raise RuntimeError(f"the rollout ran past the workload's {plan.turns} turns")

    def mark(self, trace: Trace, kind: str) -> None:
        trace.marks.append(Mark(time.perf_counter(), kind))

    @property
    def http_url(self) -> str:
        return str(self.host).rstrip("/")

    @property
    def ws_url(self) -> str:
        return "ws" + self.http_url[4:] + "/v1/responses"


class HttpRollout(_Rollouts):
    """``POST /v1/responses`` with ``stream: true`` per turn, on one keep-alive connection."""

    def on_start(self) -> None:
        super().on_start()
        self.mode = self.environment.parsed_options.rl_http_mode
        self.session = requests.Session()
        self.json_headers = {**self.headers, "content-type": "application/json"}

    def on_stop(self) -> None:
        self.session.close()

    def run_rollout(self, plan: RolloutPlan, trace: Trace) -> None:
        self.chained(plan, trace, self.mode == "http-prev")

    def exchange(self, body: dict[str, Any], trace: Trace) -> dict[str, Any]:
        return self._exchange(body, trace)

    def _exchange(self, body: dict[str, Any], trace: Trace) -> dict[str, Any]:
        self.mark(trace, SEND)
        with self.session.post(
            self.http_url + "/v1/responses",
            data=encode(messages.streaming(body)),
            headers=self.json_headers,
            stream=True,
            timeout=600,
        ) as reply:
            if reply.status_code != 200:
                raise RuntimeError(f"HTTP {reply.status_code}: {reply.text[:300]}")
            parser = SseParser()
            for chunk in reply.iter_content(chunk_size=None):
                for sse in parser.feed(chunk):
                    event = decode(sse.data)
                    self.mark(trace, event.get("type", ""))
                    if event.get("type") == "error":
                        raise RuntimeError(str(event.get("error")))
                    if event.get("type") in TERMINAL_TYPES:
                        response: dict[str, Any] = event["response"]
                        return response
        raise RuntimeError("the stream ended without a terminal event")


class _WebSocketRollout(_Rollouts):
    abstract = True
    query = ""

    def on_start(self) -> None:
        super().on_start()
        self.ws: websocket.WebSocket | None = None

    def connection(self) -> websocket.WebSocket:
        if self.ws is None:
            header = [f"{k}: {v}" for k, v in self.headers.items()]
            self.ws = websocket.create_connection(
                self.ws_url + self.query, header=header, enable_multithread=False
            )
        return self.ws

    def reconnect(self) -> None:
        if self.ws is not None:
            self.ws.close()
            self.ws = None

    def on_stop(self) -> None:
        self.reconnect()

    def send(self, trace: Trace, event: dict[str, Any]) -> None:
        self.mark(trace, SEND)
        self.connection().send(encode(event).decode())

    def recv(self, trace: Trace) -> dict[str, Any]:
        event: dict[str, Any] = decode(self.connection().recv())
        self.mark(trace, event.get("type", ""))
        if event.get("type") == "error":
            raise RuntimeError(str(event.get("error")))
        return event


class GaWebSocketRollout(_WebSocketRollout):
    """GA WebSocket mode: a flat ``response.create`` per turn, chained with ``previous_response_id``."""

    mode = "ws"

    def run_rollout(self, plan: RolloutPlan, trace: Trace) -> None:
        self.chained(plan, trace, True)

    def exchange(self, body: dict[str, Any], trace: Trace) -> dict[str, Any]:
        self.send(trace, messages.create(body))
        while (event := self.recv(trace)).get("type") not in TERMINAL_TYPES:
            pass
        response: dict[str, Any] = event["response"]
        return response


class LongLivedRollout(_WebSocketRollout):
    """The prototype: one ``response.create``, then a ``response.append`` of the outputs per suspension."""

    mode = "longlived"
    query = "?protocol=longlived"

    def run_rollout(self, plan: RolloutPlan, trace: Trace) -> None:
        self.send(trace, messages.create(plan.request()))
        turn = 0
        while True:
            event = self.recv(trace)
            kind = event.get("type")
            if kind in TERMINAL_TYPES:
                trace.add_response(event["response"])
                return
            if kind == "response.done" and event.get("can_append"):
                pending = {p["call_id"] for p in event.get("pending_calls", [])}
                calls = [c for c in function_calls(event.get("response", {})) if c["call_id"] in pending]
                send = _answers_for(plan, turn)
                gevent.sleep(send.wait_s)
                self.send(trace, messages.append(answer(calls, send)))
                turn += 1


# ---------------------------------------------------------------------------------------- the exact figures
@events.report_to_master.add_listener
def _ship(client_id: str, data: dict[str, Any]) -> None:
    """A worker's periodic (and final) report carries the samples taken since the last one."""
    data["rl_samples"] = {mode: dict(metrics) for mode, metrics in SAMPLES.items()}
    data["rl_errors"] = dict(ERRORS)
    SAMPLES.clear()
    ERRORS.clear()


@events.worker_report.add_listener
def _merge(client_id: str, data: dict[str, Any]) -> None:
    for mode, metrics in data.get("rl_samples", {}).items():
        for metric, values in metrics.items():
            SAMPLES[mode][metric].extend(values)
    for mode, count in data.get("rl_errors", {}).items():
        ERRORS[mode] += count


def summary() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in sorted(set(SAMPLES) | set(ERRORS)):
        row: dict[str, Any] = {"errors": ERRORS.get(mode, 0)}
        for metric in METRICS:
            values = SAMPLES[mode].get(metric, [])
            row[metric.lower()] = {
                "n": len(values),
                **{f"p{q}_ms": percentile(values, q) for q in (50, 90, 99)},
            }
        out[mode] = row
    return out


@events.quitting.add_listener
def _report(environment: Environment, **_: Any) -> None:
    if isinstance(environment.runner, WorkerRunner):
        return  # the master reports
    figures = summary()
    where = "master" if isinstance(environment.runner, MasterRunner) else "local"
    print(f"\nresponses-lab figures ({where}; exact, every sample; ms):")
    print(
        f"{'mode':<10} {'rollouts':>8} {'errors':>6} {'TTFT p50':>9} {'p90':>8} {'p99':>8} {'E2E p50':>9} "
        f"{'p99':>9} {'ovh p50':>8} {'p99':>8}"
    )
    for mode, row in figures.items():
        t, e, o = row["ttft"], row["e2e"], row["overhead"]
        print(
            f"{mode:<10} {e['n']:>8} {row['errors']:>6} {t['p50_ms']:>9.2f} {t['p90_ms']:>8.2f} "
            f"{t['p99_ms']:>8.2f}"
            f" {e['p50_ms']:>9.1f} {e['p99_ms']:>9.1f} {o['p50_ms']:>8.2f} {o['p99_ms']:>8.2f}"
        )
    out = environment.parsed_options.rl_out if environment.parsed_options else ""
    if out:
        Path(out).write_text(json.dumps(figures, indent=2, allow_nan=True), encoding="utf-8")
