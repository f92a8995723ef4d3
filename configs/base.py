"""Transformer base, WMT 2014 English->German (Table 2: 27.3 BLEU; Table 3 base row).

Command:   python train.py --config configs/base.py --workdir runs/table2/base_ende
Hardware:  the paper used 8 P100 GPUs: 0.4 s/step, 100k steps, 12 hours. On TPU slices: the
           compiler's estimates in docs/accelerators.md (python benchmarks/compiled_table.py);
           `python -m tx reproduce --plan --hardware v5p-8` reads them.
Expected:  newstest2013 per-token perplexity about 4.9 (Table 3), newstest2014 BLEU 27.3
           (tokenized, compound-split, last 5 checkpoints averaged); sacreBLEU about 0.7 lower.
"""

from tx.config import defaults


def get_config():
    # The paper's base recipe is the default of every section: tx/model/transformer_config.py
    # (model), tx/data/settings.py, tx/train/settings.py (optim, train, mesh),
    # tx/infer/settings.py (decode) hold each field with its comment. Here: what differs.
    cfg = defaults()
    cfg.model.vocab_multiple = 128  # embedding rows padded to whole tiles; the padding is masked
    # Compute dtype; parameters and Adam's moments stay float32, products accumulate in float32.
    # bf16 on GPUs and TPUs, and on CPUs with bf16 units (avx512_bf16: faster there than float32,
    # docs/performance.md). CPUs without them: set "float32" (not measured).
    cfg.model.dtype = "bfloat16"
    cfg.reference = dict(  # the paper's figures for this configuration (for reports only)
        params_m=65.0,  # Table 3 "params" (millions)
        dev_ppl=4.92,  # Table 3, newstest2013 per-word-piece perplexity
        dev_bleu=25.8,  # Table 3, newstest2013
        test_bleu=27.3,  # Table 2, newstest2014, tokenized + compound-split
        train_cost_flops=3.3e18,  # Table 2: training time x GPUs x sustained FLOP/s per GPU
    )
    return cfg
