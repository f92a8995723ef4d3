"""A corpus of your own of up to a few hundred thousand sentence pairs, trained on a CPU.

Command:   python -m tx train --config configs/small.py --workdir runs/mine \\
             --config.data.train_prefix=data/train --config.data.dev_prefix=data/dev \\
             --config.data.test_prefix=data/test --config.data.src_lang=en \\
             --config.data.tgt_lang=fr
           python -m tx average --workdir runs/mine
           python -m tx evaluate --workdir runs/mine --split test
Hardware:  2 CPU cores.
Time:      training stops after 27 minutes (train.max_minutes, data preparation and dev
           evaluations included), or earlier once 3 dev evaluations in a row have not beaten the
           best dev loss; `average` and `evaluate` fit in the rest of 30 minutes.
Expected:  on 87,000 pairs of English->French interface text, test sacreBLEU 38.1 after 30
           minutes of training on 2 CPU cores (benchmarks/results/small_recipe.json). Every
           budget, a second language pair, and the measurements behind each choice below:
           docs/small_recipe.md.

The paper's base settings suit millions of pairs seen for many epochs. Below a few hundred
thousand pairs smaller vocabularies and models do better (Araabi and Monz 2020, "Optimizing
Transformer for Low-Resource Neural Machine Translation"), and in tens of minutes on two CPU
cores a model sees the corpus only a few times, so it under-fits rather than over-fits. Hence a
model smaller than fairseq's `transformer_iwslt_de_en` (the usual recipe at 160k pairs), no
dropout, and small, frequent updates.
"""

import os

from tx.config import read_config


def get_config():
    cfg = read_config(os.path.join(os.path.dirname(__file__), "base.py"))
    d, m, o, t = cfg.data, cfg.model, cfg.optim, cfg.train

    d.source = "text"  # your files: --config.data.train_prefix=... (above)
    # One shared BPE vocabulary of 8,000 pieces: small vocabularies do better below a few
    # hundred thousand pairs (Sennrich and Zhang 2019; Araabi and Monz 2020). No BPE-dropout:
    # like dropout, a regulariser for runs many epochs long.
    d.vocab_size = 8000
    d.spm_sample_size = 1_000_000  # sentences (both sides) to learn it from: all of a small corpus
    # Pairs over 128 tokens (under 1%) are left out of training; rows of 256 cost 15% more a
    # step and did not make fewer repetition loops.
    d.max_len = 128
    d.bucket_lengths = (8, 16, 24, 32, 48, 64, 96, 128)  # dev and test are decoded by length
    d.pack = True  # training rows of 128 tokens packed with several pairs: one compiled shape
    # Tokens per side per step, half of fairseq's 4,096: early on, more updates beat bigger ones
    # (3,500 needed about twice the time to reach the same dev loss); fewer fall behind, as
    # part of a step's cost does not shrink with it.
    d.tokens_per_step = 1750

    # Half fairseq's width, its d_ff and heads: the step is what the CPU can afford; narrower is
    # not much faster on a CPU and has far less capacity.
    m.d_model = 256
    m.num_heads = 4
    m.d_ff = 1024
    # One matrix for source and target embeddings and the pre-softmax layer (the paper's;
    # copying names needs the source and target pieces alike). Three over-fitted sooner.
    m.share_embeddings = True
    # A deeper encoder and a shallower decoder (Kasai et al. 2021, "Deep Encoder, Shallow
    # Decoder"): a decoder layer costs more than an encoder layer (its cross-attention), so 4+2
    # trains and decodes faster than 3+3, and learned more in the same time.
    m.num_encoder_layers = 4
    m.num_decoder_layers = 2
    # LayerNorm before each sub-layer (Nguyen and Salazar 2019, "Transformers without Tears"):
    # stable at the higher learning rates a short run needs.
    m.pre_ln = True
    # No dropout: fairseq's 0.3 fights over-fitting over tens of epochs; this budget sees a few,
    # where dropout only slows the fit. Past ~10 epochs, or on a smaller corpus, watch the dev
    # curve: --config.model.dropout_rate=0.1.
    m.dropout_rate = 0.0
    m.attention_dropout_rate = 0.0
    m.relu_dropout_rate = 0.0
    m.dtype = "float32"  # bf16 steps of this model were no faster, even with avx512_bf16

    # The paper's schedule: peak 0.55 x 256^-0.5 x 300^-0.5 = 2.0e-3 at step 300, then 1/sqrt.
    # It does not depend on num_steps, so a run stopped at any budget had the same schedule and
    # `train` again extends it (a cool-down to zero would not, and translated no better); higher
    # peaks gained nothing.
    o.warmup_steps = 300
    o.learning_rate_scale = 0.55

    # A time budget: 27 minutes of training (data preparation and dev evaluations included)
    # leave `average` and `evaluate` room within 30 on 2 CPU cores; --config.train.max_minutes=M
    # gives it the time you have. No step limit besides: the dev loss stops a run that has
    # passed its best (below).
    t.max_minutes = 27.0
    t.num_steps = 100_000
    t.label_smoothing = 0.1  # the paper's, and fairseq's
    # Token-level unlikelihood (Welleck et al. 2020, "Neural Text Generation with Unlikelihood
    # Training"; tx.train.losses) against repetition loops: training pushes down a token that
    # came earlier in the target sentence where the reference does not repeat it, steeply for a
    # confident repeat, the start of a loop. The search stays the paper's. Weight 2, twice
    # theirs: on English->Dutch it halved the loops that weight 1 left, at the same BLEU.
    t.unlikelihood = 2.0
    t.checkpoint_every_secs = 0
    t.checkpoint_every_steps = 50  # averaging window: the last 5, 250 steps
    t.keep_checkpoints = 5
    t.log_every_steps = 50
    # The dev loss decides (a few seconds each, every 200 steps): dev BLEU searches the whole
    # dev split, minutes on 2 cores that training can use. BLEU on dev as well:
    # --config.train.eval_bleu_every_steps=1000 --config.train.best_metric=dev_bleu.
    t.eval_every_steps = 200
    t.eval_bleu_every_steps = 0
    # The 3 best by dev loss are kept; 3 evaluations without a better one stop the run.
    t.keep_best = 3
    t.best_metric = "dev_loss"
    t.early_stopping_patience = 3
    # The last 5: within a short run the newest checkpoints are the best ones. A long run that
    # passed its peak: `tx average --which best` or `evaluate --checkpoint best`.
    cfg.decode.average_which = "last"
    cfg.decode.average_last = 5
    cfg.decode.batch_tokens = 4096
    cfg.reference = dict(params_m=None, dev_ppl=None, dev_bleu=None, test_bleu=None)
    return cfg
