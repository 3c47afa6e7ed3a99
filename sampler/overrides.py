"""The models one engine serves: the catalogue (``sampler.models.MODELS``) with ``--model-override``s
applied. The API server's in-process engines and ``responses-lab engine`` build theirs here, from the
same flags, so both serve the same models."""

from __future__ import annotations

from sampler.models import MODELS, ModelSpec


def model_specs(overrides: list[str] | None = None) -> dict[str, ModelSpec]:
    """``["mock-1000tps:inter-token-latency=0.5,max-num-seqs=8", …]`` over the catalogue; ValueError
    names an unknown model or knob."""
    specs = dict(MODELS)
    for text in overrides or []:
        name, _, knobs = text.partition(":")
        if name not in specs:
            raise ValueError(f"--model-override names an unknown model {name!r}")
        specs[name] = apply_knobs(specs[name], knobs)
    return specs


def apply_knobs(spec: ModelSpec, knobs: str) -> ModelSpec:
    """``inter-token-latency=0.5,max-num-seqs=8`` (llm-d knob names) over a model's settings."""
    public = spec.public()
    changes: dict[str, object] = {}
    for pair in filter(None, knobs.split(",")):
        key, _, value = pair.partition("=")
        if key not in public:
            raise ValueError(f"unknown model knob {key!r}; known: {', '.join(sorted(public))}")
        changes[key] = _knob_value(public[key], value)
    return spec.override(**changes)


def _knob_value(current: object, text: str) -> object:
    """A knob's text, converted to the type of the value it replaces (the flag is a string)."""
    if isinstance(current, bool):
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"not a boolean: {text!r}")
    if isinstance(current, int):
        return int(text)
    return float(text)
