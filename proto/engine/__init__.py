"""The engine hop: the GPU in its own process, spoken to over the subset of vLLM's OpenAI-compatible
completions API the API tier needs (docs/engine.md, "The completions protocol"), so the same API server drives
the mock engine
(``responses-lab engine``) or a real vLLM.

``wire`` is the subset's messages (no I/O); ``app`` is the mock engine's server; ``client`` is the API
tier's side: ``RemoteEngine``, which implements ``sampler.engine.Engine`` over a pool of keep-alive
connections.
"""
