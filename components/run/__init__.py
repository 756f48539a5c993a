"""The run wing: what every recipe shares, above every brick (nothing below imports it).

- ``config.py``: the run's config tree (``RunConfig``; the sampling and rollout-scheduling bricks' configs);
- ``directory.py``: the run directory (which steps are done: ``RunStack.ledger``, one for every mode);
- ``stack.py``: Ray, the bricks (``Bricks``) and the stack's lifecycle (``RunStack``);
- ``loop.py``: the one recipe loop (``run_recipe_loop``) and its ``sync`` mode; ``overlapped.py``: ``async`` and
  ``partial``; ``step_metrics.py``: what the loops measure around each step;
- ``entry.py``: a recipe's command line (``main_entry``).

A recipe builds its tasks, harness and grader, then drives ``RunStack`` step by step; the stack's own bricks
(engine, proxy, algorithm, sandbox provider: objects satisfying ``components.protocols``) come from ``Bricks.from_config``
unless the recipe passes its own, and the stack never asks which kind they are::

    run = RunDirectory.create(config, recipe="swe_grpo")
    async with RunStack.start(config, run, sandbox_paths=...) as stack:  # or bricks=Bricks(...)
        for step in stack.pending_steps(config.num_steps):
            trajectories, shard = await stack.rollout_or_load(step, runner, tasks)
            train_metrics = await stack.train_and_sync(step, [shard] if shard else [])
            monitor.end_step(step, trajectories, train_metrics=train_metrics)  # the step's row first,
            await stack.checkpoint_if_due(step)  # then the checkpoint that marks it done

Run directory (``runs/<recipe>-<time>`` unless ``--run-dir``): ``config.json``, ``trajectories/`` (one Parquet
shard per step; in ``--rollout-mode async`` / ``partial`` one per GRPO group), ``metrics.jsonl``, ``checkpoints/step-N`` (HF folders + optimizer + ``trainer_state.json``),
``logs/driver.log``, ``wandb/`` (offline unless logged in), ``learning_curves.png``, ``viewer/index.html``.

Placement through Ray resources:
  - engine: one ``EngineActor`` with ``engine.num_cpus`` CPUs and ``engine.num_gpus`` GPUs (``--engine embedded``);
    with ``--engine sglang`` the SGLang servers run outside Ray and the recipe only talks HTTP to ``sglang.url``;
  - proxy: session-shard actors and ``proxy.replicas`` Ray Serve replicas, 0 CPUs each (they wait on I/O);
    ``--proxy local`` serves it from the driver process instead (one fewer moving part, no Serve start-up);
  - sandboxes: the driver's bubblewrap pool keeps ``sandbox.num_warm`` started (``--sandbox-backend e2b``: E2B's
    cloud); on a multi-node cluster use ``sandboxes.ray_pool`` whose capacity is the ``sandbox_slots`` resource;
  - trainer: ``trainer.num_workers`` Ray Train FSDP2 workers with ``trainer.cpus_per_worker`` CPUs (1 GPU each when
    ``trainer.use_gpu``);
  - rollout producer (harness runs, grading, the agents' sandboxes): in the driver, or with
    ``--rollout-placement actor`` one Ray actor with ``rollout.actor_num_cpus`` CPUs and the custom resources
    ``rollout.actor_resources`` (e.g. ``rollout=1`` that only sandbox nodes offer), its sandboxes started on its
    node; it needs ``--proxy serve`` (``components/rollout/producer.py``).

Resume rule (same ``--run-dir``): the trainer restarts from the newest complete checkpoint, whose
``consumed_shards`` lists the step shards already trained into it. Each step is then, in order: *done* when its
shard was consumed (skipped), *stored* when its shard exists but was not consumed (trained again from the shard,
never rolled out again), *new* otherwise (rolled out, written as one shard, trained). A shard is written
atomically, so a crash mid-rollout leaves no partial step: its rollouts are redone. No trajectory is lost or
duplicated, and the engine restarts from the checkpoint's weights and version.

Resume rule of ``--rollout-mode async`` and ``partial`` (``components/run/overlapped.py``): shards are per
group, committed as each group completes, and which shard went into which step (and which were dropped for staleness) is the
``trajectory_ledger`` in the checkpoint's trainer state, saved with the weights it describes. On restart the
steps in the ledger are done; every committed group the ledger does not name goes back into the buffer and is
trained exactly once; a group index handed out but never committed (in flight at the crash, or given up as too
stale) is rolled out again; the engine restarts from the checkpoint's weights and version. A run directory
keeps its mode's shard layout: resuming a sync run's untrained step shard in an overlapped mode is refused.
"""
