"""The lab's workload: what every client sends (``plan``), read from TraceLab files (``traces``), Codex CLI's
session files (``codex_rollout``), a synthetic generator (``synthetic``) or a published comparison's preset
(``scenarios``)."""
