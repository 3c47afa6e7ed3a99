"""The lab's outputs: results.json and results.csv (``results``), the printed tables and plots (``tables``),
``trace.json`` (``timeline``), and docs/lab-results.md with NOTES.md's block from kept runs (``writeup``,
``markdown``)."""
