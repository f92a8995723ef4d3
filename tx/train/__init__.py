"""The training wing: from a config and data to checkpoints.

    settings.py      the config's `optim`, `train`, `mesh` sections (tx.config's layer)
    sharding.py      the device mesh, logical axis rules, data shards per process
    optim.py         Adam with the paper's inverse-square-root warm-up
    losses.py        label-smoothed cross-entropy, in pieces over the vocabulary
    trainer.py       the pure, jitted train and eval steps and their sharded state
    loop.py          the loop: resume, batches, steps, evaluation, checkpoints, summaries
    prepare.py       the data prepared once before training (`tx prepare`), and the check
                     a multi-process train makes instead of tokenizing
    checkpoint.py    Orbax checkpoints: save, restore, keep the last N and the best
    averaging.py     averaging the last N or best N checkpoints, and the store of averages
    init_from.py     starting a run from another's parameters and vocabulary (fine-tuning)
    runlock.py       one run per workdir: the lock that train and average hold
    monitor.py       the metrics window (a non-finite loss raises Diverged), throughput,
                     MFU, progress lines
    events.py        TensorBoard event files: the scalars training writes, read back
    distributed.py   jax.distributed start-up, barriers, a stop signal every process agrees
                     on, a lost process
    runcard.py       the run card: what ran, on what, with which code and data
    sizing.py        what a config asks for: parameters, rows and real tokens per step
    aot.py           the train step compiled ahead of time for a slice: memory, step time
    chips.py         HBM, peak FLOP/s and bandwidth of the TPUs and GPUs tx plans for
    kept.py          programs kept traced (jax.export) and the parameters' abstract tree,
                     beside the compilation cache: what a warm command does not trace again

May import: tx.tokens, tx.model, tx.config, tx.workdir, tx.data and this wing.
settings.py sits at tx.config's layer: it imports nothing of tx above tx.model.
"""
