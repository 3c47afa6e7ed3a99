"""``make vllm-check``: a real vLLM (CPU build) behind the same lab, and the mock engine beside it.

    .venv/bin/python scripts/vllm_check.py --vllm-python .venv-vllm/bin/python [--out vllm-out]

1. Builds the tiny random-weight model offline (``scripts/vllm_tiny_model.py``, in vLLM's venv).
2. Starts ``vllm serve`` on it, serving it under the mock models' names (so every request the lab sends
   names a model vLLM has), with prefix caching, ``--enable-prompt-tokens-details`` (cached tokens in the
   usage) and ``--enable-per-request-metrics`` (prefill and queue time in the last chunk); and
   ``responses-lab engine`` (the mock) on the same ports' neighbours. An API server
   (``responses-lab serve --engine URL``) in front of each.
3. Through vLLM: the long-lived demo (``responses-lab demo --url``, must exit 0) and a short bench
   (``responses-lab bench --url … --quick``, long-lived and HTTP, one session).
4. The comparison, the same probe through both engines: long-lived rollouts whose every turn appends a
   tool output (the prefix hits), and HTTP requests of the same final history with a fresh prefix (no hit).
   Per turn: TTFT at the client, the engine's prefill and cached tokens, the inter-token gaps at the
   client. Then the mock's knobs fitted to vLLM (prefill = overhead + per-token × uncached, least squares;
   ITL the median gap): what ``--model-override`` the mock would need to match it.

Writes ``OUT/vllm_check.json`` and prints the figures; exits non-zero, saying which step failed, otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import connect

from proto.processes import ChildEngine, ChildServer
from proto.server.serve import free_port

ROOT = Path(__file__).resolve().parent.parent
MODEL = "mock-4000tps"  # the name the probe asks for; vLLM serves its tiny model under it
SERVED = ["mock-4000tps", "mock-1000tps", "mock-65tps"]
TOOLS = [{"type": "function", "name": "read_file"}]
TURNS = 8
CHUNK = (
    "def handler(request):\n    return compute(request.payload, retries=3)  # line\n" * 12
)  # ~240 tokens a tool output


class Step(Exception):
    """A step of the check failed: the message says which and why."""


def build_model(vllm_python: str, out: Path) -> Path:
    model = out / "model"
    if not (model / "config.json").exists():
        run(
            [vllm_python, str(ROOT / "scripts" / "vllm_tiny_model.py"), str(model)],
            "building the tiny model",
            env=offline_env(),
        )
    return model


def offline_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPONSES_LAB_")}
    # Nothing from a model hub; vLLM's CPU platform; its KV cache in GiB (2 GiB: ~4 M token slots here).
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_TARGET_DEVICE="cpu",
        VLLM_CPU_KVCACHE_SPACE="2",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    return env


def run(command: list[str], what: str, env: dict[str, str] | None = None, timeout: float = 900) -> str:
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    if result.returncode != 0:
        raise Step(f"{what} failed (exit {result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}")
    return result.stdout


class Vllm:
    """``vllm serve MODEL`` in vLLM's venv, on a free port."""

    def __init__(self, vllm_python: str, model: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        vllm = str(Path(vllm_python).with_name("vllm"))
        command = [
            vllm,
            "serve",
            str(model),
            "--served-model-name",
            *SERVED,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            "65536",
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--enable-per-request-metrics",
            "--max-num-seqs",
            "16",
            "--seed",
            "0",
        ]
        self.command = command
        self._out = log.open("wb")
        self.proc = subprocess.Popen(
            command, stdout=self._out, stderr=subprocess.STDOUT, env=offline_env(), start_new_session=True
        )

    def wait_ready(self, timeout_s: float = 900.0) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.proc.poll() is not None:
                raise Step(
                    f"vllm serve exited with {self.proc.returncode} during "
                    f"start-up:\n{self.log.read_text(errors='replace')[-4000:]}"
                )
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise Step(
            f"vllm serve did not answer /health within {timeout_s} "
            f"s:\n{self.log.read_text(errors='replace')[-4000:]}"
        )

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._out.close()


# ------------------------------------------------------------------------------------------ the probe
async def rollout(ws_url: str) -> list[dict[str, Any]]:
    """One long-lived rollout of TURNS turns; per turn the server's report plus the client's TTFT and gaps."""
    script = (
        f"Session {uuid.uuid4().hex[:12]}. Read the files.\n"
        + "\n".join(f'!tokens 40 !call read_file {{"path": "m{i}.py"}}' for i in range(TURNS - 1))
        + "\n!tokens 40 !say done"
    )
    turns: list[dict[str, Any]] = []
    async with connect(ws_url + "?protocol=longlived", max_queue=None, max_size=None) as ws:
        sent, deltas = time.perf_counter(), []
        await ws.send(
            json.dumps({"type": "response.create", "model": MODEL, "input": script, "tools": TOOLS})
        )
        while True:
            event = json.loads(await ws.recv())
            kind = event["type"]
            if kind.endswith(".delta"):
                deltas.append(time.perf_counter())
            elif kind in ("response.done", "response.completed"):
                report = event["response"]["lab"]["turns"][-1]
                gaps = [(b - a) * 1e3 for a, b in itertools.pairwise(deltas)]
                turns.append(
                    {**report, "ttft_ms": (deltas[0] - sent) * 1e3 if deltas else None, "gaps_ms": gaps}
                )
                if kind == "response.completed":
                    return turns
                answers = [
                    {"type": "function_call_output", "call_id": c["call_id"], "output": CHUNK}
                    for c in event["pending_calls"]
                ]
                sent, deltas = time.perf_counter(), []
                await ws.send(json.dumps({"type": "response.append", "input": answers}))
            elif kind in ("response.failed", "response.incomplete", "error"):
                raise Step(f"the probe's rollout ended {kind}: {json.dumps(event)[:500]}")


async def cold(http_url: str, tokens_like: int) -> dict[str, Any]:
    """One HTTP response whose prompt is about ``tokens_like`` tokens with a fresh prefix: nothing cached."""
    text = f"Session {uuid.uuid4().hex[:12]}.\n" + CHUNK * max(1, tokens_like // 240)
    async with httpx.AsyncClient(timeout=300) as http:
        reply = (
            await http.post(
                http_url + "/v1/responses",
                json={"model": MODEL, "input": text + "\n!tokens 40 !say done", "store": False},
            )
        ).json()
    if reply.get("status") != "completed":
        raise Step(f"the cold request ended {reply.get('status')}: {json.dumps(reply)[:500]}")
    turn: dict[str, Any] = reply["lab"]["turns"][0]
    return turn


async def probe(server: ChildServer, rollouts: int) -> dict[str, Any]:
    hot = [turn for _ in range(rollouts) for turn in await rollout(server.ws_url)]
    colds = [await cold(server.http_url, hot[-1]["prompt_tokens"]) for _ in range(rollouts)]
    return {"turns": hot, "cold": colds}


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    first = [t for t in result["turns"] if t["cached_tokens"] == 0]
    hits = [t for t in result["turns"] if t["cached_tokens"] > 0]
    gaps = [g for t in result["turns"] for g in t["gaps_ms"]]

    def med(rows: list[dict[str, Any]], key: str) -> float | None:
        values = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(values) if values else None

    return {
        "ttft_ms_p50": med(result["turns"], "ttft_ms"),
        "prefill_ms_first_turn_p50": med(first, "prefill_ms"),
        "prompt_tokens_first_turn": med(first, "prompt_tokens"),
        "prefill_ms_with_hits_p50": med(hits, "prefill_ms"),
        "uncached_tokens_with_hits_p50": statistics.median(
            t["prompt_tokens"] - t["cached_tokens"] for t in hits
        )
        if hits
        else None,
        "cached_share_with_hits": sum(t["cached_tokens"] for t in hits)
        / max(1, sum(t["prompt_tokens"] for t in hits)),
        "prefill_ms_cold_p50": med(result["cold"], "prefill_ms"),
        "prompt_tokens_cold": med(result["cold"], "prompt_tokens"),
        "engine_itl_ms_p50": statistics.median(
            t["decode_ms"] / (t["output_tokens"] - 1) for t in result["turns"] if t["output_tokens"] > 1
        ),
        "client_gap_ms_p50": statistics.median(gaps) if gaps else None,
        # Turns whose first token reached the client after half the engine's decode time: streamed late, in a
        # burst.
        "late_turns": sum(
            1
            for t in result["turns"]
            if t["ttft_ms"] and t["ttft_ms"] > t["prefill_ms"] + t["queue_wait_ms"] + t["decode_ms"] / 2
        ),
        "turns": len(result["turns"]),
        "client_gap_ms_p99": statistics.quantiles(gaps, n=100)[98] if len(gaps) >= 100 else None,
        "engine_hop_ms_p50": statistics.median(
            t["phases_ms"].get("engine_hop", 0.0) for t in result["turns"]
        ),
    }


def fit(result: dict[str, Any]) -> dict[str, float]:
    """prefill_ms = overhead + per_token × uncached over every turn (least squares); the ITL is the engine's
    own (decode time ÷ (tokens − 1), median over turns): the gaps a client sees also hold what the engine's
    frontend adds (vLLM's API process, CPU-starved on 2 cores, sends several tokens in one chunk)."""
    rows = [
        (t["prompt_tokens"] - t["cached_tokens"], t["prefill_ms"]) for t in result["turns"] + result["cold"]
    ]
    xs, ys = [r[0] for r in rows], [r[1] for r in rows]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    itl = [t["decode_ms"] / (t["output_tokens"] - 1) for t in result["turns"] if t["output_tokens"] > 1]
    return {
        "prefill-overhead": max(0.0, my - slope * mx),
        "prefill-time-per-token": max(0.0, slope),
        "inter-token-latency": statistics.median(itl) if itl else 0.0,
    }


# ------------------------------------------------------------------------------------------ the check
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--out", type=Path, default=Path("vllm-out"))
    parser.add_argument("--rollouts", type=int, default=3)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"command": "make vllm-check (scripts/vllm_check.py)"}
    vllm: Vllm | None = None
    started: list[Any] = []
    try:
        print("· building the tiny model (offline)", flush=True)
        model = build_model(args.vllm_python, args.out)
        print("· starting vllm serve", flush=True)
        vllm = Vllm(args.vllm_python, model, args.out / "vllm-serve.log")
        report["vllm_start_s"] = vllm.wait_ready()
        report["vllm_version"] = run(
            [args.vllm_python, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
            "vllm version",
        ).strip()
        mock = ChildEngine()
        started.append(mock)
        mock.wait_ready()
        api_vllm = ChildServer(["--engine", vllm.url, "--log-level", "warning"])
        api_mock = ChildServer(["--engine", mock.http_url, "--log-level", "warning"])
        started += [api_vllm, api_mock]
        api_vllm.wait_ready()
        api_mock.wait_ready()
        print(f"· vllm serve ready in {report['vllm_start_s']:.0f} s; the demo through it", flush=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESPONSES_LAB_")}
        demo = run(
            [sys.executable, "-m", "proto", "demo", "--url", api_vllm.ws_url, "--model", MODEL],
            "the demo through vLLM",
            env=env,
        )
        report["demo_tail"] = demo.strip().splitlines()[-12:]
        print("\n".join(report["demo_tail"]), flush=True)
        print("· a short bench through vLLM", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            run(
                [
                    sys.executable,
                    "-m",
                    "proto",
                    "bench",
                    "--url",
                    api_vllm.ws_url,
                    "--quick",
                    "--modes",
                    "longlived,http",
                    "--sessions",
                    "1",
                    "--no-plots",
                    "--out",
                    str(args.out / "bench-vllm"),
                ],
                "the bench through vLLM",
                env={**env, "TMPDIR": tmp},
            )
        bench = json.loads((args.out / "bench-vllm" / "results.json").read_text())
        report["bench_vllm"] = [
            {
                k: run_[k]
                for k in (
                    "mode",
                    "e2e_s_p50",
                    "ttft_ms_p50",
                    "tpot_ms_p50",
                    "itl_ms_p99",
                    "turn_overhead_ms_p50",
                    "usage",
                    "phases_ms",
                )
            }
            for run_ in bench["runs"]
        ]
        print("· the probe through both engines", flush=True)
        for name, server in (("vllm", api_vllm), ("mock", api_mock)):
            result = asyncio.run(probe(server, args.rollouts))
            report[name] = {
                "summary": summarize(result),
                "fit": fit(result),
                "turns": result["turns"],
                "cold": result["cold"],
            }
            print(f"  {name}: {json.dumps(report[name]['summary'])}", flush=True)
        knobs = report["vllm"]["fit"]
        report["mock_override_to_match_vllm"] = f"{MODEL}:" + ",".join(
            f"{k}={v:.4g}" for k, v in knobs.items()
        )
        print(f"· the mock would need: --model-override {report['mock_override_to_match_vllm']}", flush=True)
        ok = True
    except Step as exc:
        report["failed"] = str(exc)
        print(f"✗ {exc}", file=sys.stderr)
        ok = False
    finally:
        for child in reversed(started):
            child.stop()
        if vllm is not None:
            vllm.stop()
    for side in ("vllm", "mock"):  # the per-turn rows stay in the file; the gaps are summarized
        for turn in report.get(side, {}).get("turns", []):
            turn.pop("gaps_ms", None)
    (args.out / "vllm_check.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out / 'vllm_check.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
