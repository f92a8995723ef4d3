"""Adapting a trained run to a new domain without losing the old one: its own config, started
from its parameters, at a low constant learning rate, the old domain's text mixed in, the new
domain's dev set choosing the checkpoints and the old one's watched beside it.

Command:   python -m tx train --config configs/finetune.py:runs/base --workdir runs/tuned \\
             --config.data.train_prefix=old/train,new/train \\
             --config.data.train_weights='(1, 1)' \\
             --config.data.dev_prefix=new/dev --config.data.dev2_prefix=old/dev \\
             --config.data.test_prefix=new/test
           python -m tx evaluate --workdir runs/tuned --checkpoint best
           python -m tx evaluate --workdir runs/tuned --checkpoint best --split dev2
Hardware:  whatever trained runs/base; on 2 CPU cores, minutes for a configs/small.py run.
Expected:  not measured yet: benchmarks/finetune_recipe.py measures this recipe against the
           base alone, a model trained on the new domain alone, and fine-tuning with the base's
           own schedule (issue 57), and this file will give its figures.

What it changes of the run it starts from (`train.init_from`; its config.json gives the model,
which must not change, and every other setting):
- optim: a linear warm-up of WARMUP steps to a constant LEARNING_RATE, not the paper's warm-up
  to its peak (for configs/small.py 2.0e-3): a start from trained weights has no large early
  gradients to ride out, and at the peak rate it forgets the old domain within a few hundred
  steps (benchmarks/results/finetune_recipe.json: 31.6 -> 16.9 sacreBLEU in 300 steps).
- train: a dev evaluation every EVAL_EVERY steps; the 3 best by dev loss kept, and 3 in a row
  without a better one stop the run (data.dev_prefix: the new domain's); no time budget.
- data: the source's vocabulary (train.init_from copies it in; data.vocab_path is cleared). The
  corpora are yours: the old domain's training text mixed with the new by data.train_weights
  (mixed fine-tuning, Chu et al. 2017), and its dev set as data.dev2_prefix, whose loss and
  perplexity are logged beside the new one's.
"""

import os

from tx import storage
from tx.config import ConfigError, read_config

LEARNING_RATE = 1e-4
WARMUP = 100
EVAL_EVERY = 100


def get_config(source: str = ""):
    if not source:
        raise ConfigError(
            "configs/finetune.py needs the run to start from: --config configs/finetune.py:RUN"
        )
    path = storage.join(source, "config.json")
    if not storage.exists(path):
        raise ConfigError(f"configs/finetune.py:{source}: {path} does not exist (not a tx run)")
    cfg = read_config(path)
    o, t = cfg.optim, cfg.train
    t.init_from = source if storage.is_remote(source) else os.path.abspath(source)
    t.init_from_new_params = False
    cfg.data.vocab_path = None
    o.schedule = "constant"
    o.learning_rate = LEARNING_RATE
    o.warmup_steps = WARMUP
    t.max_minutes = 0.0
    t.eval_every_steps = EVAL_EVERY
    t.checkpoint_every_steps = EVAL_EVERY
    t.keep_best = 3
    t.best_metric = "dev_loss"
    t.early_stopping_patience = 3
    return cfg
