"""The latency lab: one agent workload replayed over the designs on the same mock GPU (docs/lab.md).

By concern: ``workload`` (``workload.plan`` turns a workload into what every client sends: the same
first message, tool outputs and tool waits in every transport); ``run`` (``run.clients`` speak the wires
and record a timeline of what they saw; ``run.runner`` starts the server, runs the sessions and measures
the floor); ``analysis`` (``analysis.metrics`` turns timelines into vLLM-style figures, pure functions, no
I/O; statistics and the fast model); ``report`` (``report.results`` shapes what a run produced into
results.json, writes it and results.csv, and reads it back; ``report.tables`` draws the plots and prints
the table from it).
"""
