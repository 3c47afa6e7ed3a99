"""``Conversation.start_turn`` under ``reasoning.context`` (docs/protocol.md, "Newer fields"): the
reasoning of earlier turns leaves a reused rendering by a cut and a re-render, the result is the rendering
of the kept items, and ``history`` puts every withheld item back in its place."""

from __future__ import annotations

from proto.core.items import (
    FunctionCall,
    FunctionCallOutput,
    Item,
    Message,
    Reasoning,
    ReasoningSummary,
    item_id_of,
)
from proto.core.work import WorkCounters
from sampler.tokens import Conversation, Tokenizer


def user(text: str) -> Message:
    return Message(role="user", content=text)


def reasoning(n: int) -> Reasoning:
    return Reasoning(id=f"rs_{n}", summary=[ReasoningSummary(text=f"thought {n} " * n)])


def call(n: int) -> FunctionCall:
    return FunctionCall(call_id=f"call_{n}", name="grep", arguments="{}")


def output(n: int) -> FunctionCallOutput:
    return FunctionCallOutput(call_id=f"call_{n}", output=f"result {n}")


FIRST: list[Item] = [user("Start."), reasoning(3), call(1)]
LOOP: list[Item] = [output(1)]  # the same turn goes on
NEXT: list[Item] = [output(1), user("Next."), reasoning(5)]  # a new turn; its own reasoning stays


def rendered(items: list[Item]) -> list[int]:
    conversation = Conversation(Tokenizer(), WorkCounters())
    conversation.add_input(items)
    return list(conversation.log.ids)


def test_a_tool_loop_keeps_its_turns_reasoning() -> None:
    conversation = Conversation(Tokenizer(), WorkCounters())
    conversation.add_input(conversation.start_turn(FIRST, "current_turn"))
    conversation.add_input(conversation.start_turn(LOOP, "current_turn"))
    assert conversation.withheld == [] and conversation.log.rewrites == 0
    assert list(conversation.log.ids) == rendered(FIRST + LOOP)


def test_a_new_user_message_cuts_the_earlier_reasoning_out() -> None:
    conversation = Conversation(Tokenizer(), WorkCounters())
    conversation.add_input(conversation.start_turn(FIRST, "current_turn"))
    cut_at = conversation.starts[1]  # where the first turn's reasoning began
    conversation.add_input(conversation.start_turn(NEXT, "current_turn"))
    kept = [FIRST[0], FIRST[2], *NEXT]
    assert conversation.items == kept
    assert list(conversation.log.ids) == rendered(kept)
    assert conversation.log.rewrites == 1 and list(conversation.log.ids[:cut_at]) == rendered(FIRST)[:cut_at]
    assert conversation.withheld == [FIRST[1]]
    assert conversation.history() == FIRST + NEXT
    assert conversation.user_texts == ["Start.", "Next."]


def test_withheld_new_items_and_all_turns() -> None:
    """Earlier reasoning in the new items is withheld too; ``all_turns`` and no setting keep everything."""
    items: list[Item] = [*FIRST, output(1), reasoning(4), user("Next.")]
    conversation = Conversation(Tokenizer(), WorkCounters())
    conversation.add_input(conversation.start_turn(items, "current_turn"))
    assert [item_id_of(r) for r in conversation.withheld] == ["rs_3", "rs_4"]
    assert conversation.history() == items and conversation.log.rewrites == 0
    for context in ("all_turns", "auto", None):
        whole = Conversation(Tokenizer(), WorkCounters())
        whole.add_input(whole.start_turn(items, context))
        assert whole.withheld == [] and list(whole.log.ids) == rendered(items)
