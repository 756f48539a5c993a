"""Watching a run: metrics loggers (``logger``: metrics.jsonl + wandb), per-step rollout statistics
(``rollout_stats``), the terminal progress display (``progress``), the learning-curve PNG (``plots``), the
trajectory viewer (``viewer``, ``rein view RUN_DIR``), and ``run_monitor`` bundling them for recipes."""
