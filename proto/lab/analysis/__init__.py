"""The lab's analysis: traces into figures (``metrics``), paired gains and intervals (``stats``), the fast
model (``predict``, ``repredict``) and its curves (``sweep``)."""
