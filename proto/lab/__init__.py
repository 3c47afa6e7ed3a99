"""The latency lab: one agent workload replayed over the four transports on the same mock GPU.

``plan`` turns a workload into what every client sends (the same first message, tool outputs and tool
waits in every transport); ``clients`` speak the four wires and record a timeline of what they saw;
``metrics`` turns timelines into vLLM-style figures (pure functions, no I/O); ``runner`` starts the
server, runs the sessions and measures the floor; ``results`` shapes what they produced into results.json,
writes it and results.csv, and reads it back; ``report`` draws the plots and prints the table from it.
"""
