"""``GET /v1/models``: OpenAI's model list, and in the same object Codex's native model catalog.

OpenAI's shape is ``{"object": "list", "data": [...]}``. Codex CLI reads a provider's catalog from the
same URL when the provider sets ``model_catalog_url`` and ``[features] api_key_model_discovery = true``
(codex-rs/model-provider/src/models_endpoint.rs; LiteLLM's Codex guide gives the same two settings): it
decodes ``{"models": [ModelInfo, ...]}`` and ignores the rest, as OpenAI's SDKs ignore ``models``. One
object serves both. Without the catalog Codex runs a custom provider's model on "fallback metadata":
``exec_command``, ``view_image``, its namespace tools, but no ``apply_patch`` (docs/protocol.md, "Model
objects").

The ModelInfo fields are those of Codex 0.171's bundled catalog (codex-rs/protocol/src/openai_models.rs);
``REQUIRED`` are the ones 0.171 refuses a catalog entry without (found by dropping each field of a bundled
entry in turn against the real binary: docs/protocol.md, "Model objects" gives the command). The values
describe what the
mock model is: it calls tools in parallel, takes images, has no reasoning effort levels; its freeform
``apply_patch`` and its ``exec_command`` shell are what Codex offers such a model.
"""

from __future__ import annotations

from typing import Any

REQUIRED = (
    "slug",
    "display_name",
    "priority",
    "visibility",
    "supported_in_api",
    "shell_type",
    "support_verbosity",
    "supported_reasoning_levels",
    "truncation_policy",
    "experimental_supported_tools",
    "model_messages",
)
CONTEXT_WINDOW = 200_000  # tokens; the mock GPU's KV cache bounds nothing here, Codex compacts near it
INSTRUCTIONS = (
    "You are a responses-lab mock model. You do not read the conversation: you follow the directive script "
    "in the first user message that has directive lines (!call, !say, !tokens, !reason), one line per turn."
)


def codex_model(name: str, priority: int) -> dict[str, Any]:
    return {
        "slug": name,
        "display_name": name,
        "description": 'responses-lab mock model (scripted; see docs/protocol.md, "The directive script")',
        "priority": priority,
        "visibility": "list",
        "supported_in_api": True,
        "shell_type": "unified_exec",  # Codex's exec_command / write_stdin
        "apply_patch_tool_type": "freeform",  # the custom apply_patch tool with its lark grammar
        "input_modalities": ["text", "image"],  # view_image returns an input_image
        "supports_parallel_tool_calls": True,
        "supports_reasoning_summaries": True,  # `!reason N` items carry a summary when asked
        "support_verbosity": False,
        "default_reasoning_level": None,
        "supported_reasoning_levels": [],
        "truncation_policy": {"mode": "bytes", "limit": 10_000},
        "context_window": CONTEXT_WINDOW,
        "experimental_supported_tools": [],
        "model_messages": {"instructions_template": INSTRUCTIONS},
    }


def models_list(cards: list[dict[str, Any]]) -> dict[str, Any]:
    """``cards``: the engines' model objects (``Engines.cards``: the in-process catalogue's, or a remote
    engine's own)."""
    names = sorted(str(card["id"]) for card in cards)
    return {
        "object": "list",
        "data": sorted(cards, key=lambda card: str(card["id"])),
        "models": [codex_model(name, priority) for priority, name in enumerate(names, 1)],
    }
