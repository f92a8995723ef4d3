"""Transformer base, WMT 2014 English->German (Table 2: 27.3 BLEU; Table 3 base row).

Command:   python train.py --config configs/base.py --workdir runs/base_ende
Hardware:  the paper used 8 P100 GPUs: 0.4 s/step, 100k steps, 12 hours. On TPU slices: the
           compiler's estimates in docs/accelerators.md (python benchmarks/compiled_table.py);
           `python -m tx reproduce --plan --hardware v5p-8` reads them.
Expected:  newstest2013 per-token perplexity about 4.9 (Table 3), newstest2014 BLEU 27.3
           (tokenized, compound-split, last 5 checkpoints averaged); sacreBLEU about 0.7 lower.
"""

import ml_collections
from ml_collections import config_dict


def get_config():
    cfg = ml_collections.ConfigDict()
    vocab_size = config_dict.FieldReference(37000)

    cfg.model = dict(
        vocab_size=vocab_size,  # = data.vocab_size: one shared source-target vocabulary
        vocab_multiple=128,  # embedding rows padded to whole tiles; the padding is masked
        d_model=512,  # width of every sub-layer output and of the embeddings
        num_heads=8,  # h
        d_k=config_dict.placeholder(int),  # query/key width per head; unset -> d_model / h
        d_v=config_dict.placeholder(int),  # value width per head; unset -> d_model / h
        d_ff=2048,  # feed-forward inner width
        num_layers=6,  # N (both stacks unless the next two are set)
        num_encoder_layers=config_dict.placeholder(int),
        num_decoder_layers=config_dict.placeholder(int),
        dropout_rate=0.1,  # P_drop on sub-layer outputs and embedding+position sums
        attention_dropout_rate=0.0,  # not in the paper (tensor2tensor v1 also used 0)
        relu_dropout_rate=0.0,  # not in the paper
        share_embeddings=True,  # source embedding = target embedding = pre-softmax weights
        positional="sinusoidal",  # "learned" for Table 3 row E
        max_len=1024,  # size of the learned position table (unused for sinusoids)
        pre_ln=False,  # the paper is post-LN; pre-LN is the later, more stable variant
        layer_norm_epsilon=1e-6,
        # "auto": the splash kernel on TPUs (lengths in 128s), cuDNN flash attention on GPUs
        # (bf16/fp16), XLA's elsewhere; "explicit" forms the weights (always so for attention
        # dropout, drawn maps and d_k != d_v).
        attention_impl="auto",
        # Compute dtype; parameters and Adam's moments stay float32, products accumulate in
        # float32. bf16 on GPUs and TPUs; also on CPUs with bf16 units: on a 2-core CPU with
        # avx512_bf16 a base step (32 x 64 tokens per side) took 4.57 s in bf16 and 5.39 s in
        # float32 (issue 15's measurement). CPUs without them: set "float32" (not measured).
        dtype="bfloat16",
        param_dtype="float32",
    )

    cfg.data = dict(
        source="tfds",  # "tfds" | "text" | "demo" | "trees" (parsing: configs/table4.py)
        tfds_name="wmt14_translate/de-en",  # dev newstest2013, test newstest2014
        tfds_data_dir=config_dict.placeholder(str),  # None -> TFDS default (~/tensorflow_datasets)
        train_prefix="",  # text: <prefix>.<lang> files, one sentence per line; trees: a glob
        dev_prefix="",
        test_prefix="",
        src_lang="en",  # translation direction: EN->DE as in the paper
        tgt_lang="de",
        demo_seed=0,  # demo source: corpus generator seed
        demo_train_size=200_000,  # demo source: number of training pairs
        demo_eval_size=500,  # demo source: dev and test pairs each
        vocab_size=vocab_size,  # shared BPE vocabulary (paper: about 37k for EN-DE)
        vocab_path=config_dict.placeholder(str),  # an existing SentencePiece model to use
        spm_model_type="bpe",  # "bpe" | "unigram"
        spm_sample_size=2_000_000,  # sentences sampled (source and target) to learn the vocabulary
        spm_normalization="identity",  # round-trips text; nmt_nfkc makes … "...", NBSP " ", ﬁ "fi"
        spm_split_digits=False,  # True: every digit its own piece (not in the paper)
        max_len=256,  # training pairs longer than this (in tokens, either side) are dropped
        # Real (non-padding) tokens per side per optimizer step, global (all devices and
        # micro-batches): the paper's "approximately 25000 source tokens and 25000 target
        # tokens". Rows per bucket come from the data's mean lengths (tx/data/pipeline.py), so
        # this holds on average on any device count; padded tokens stay <= 2x this (memory).
        # tensor2tensor's transformer_base used batch_size=4096 per GPU x 8 GPUs, counted in
        # *padded* positions of the longer side: at most 32,768 per side, about 25k real
        # tokens per side once bucket padding and the shorter side are taken off.
        tokens_per_step=25_000,
        bucket_lengths=(8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 128, 160, 192, 256),
        pack=False,  # pack several pairs per row (segment ids) instead of length buckets
        shuffle_seed=0,
        num_workers=0,  # tokenizer processes; 0 -> all cores
        on_bad_line="error",  # invalid UTF-8 in training text: "error" | "skip" (counted, logged)
    )

    cfg.optim = dict(
        learning_rate_scale=1.0,  # multiplies d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
        warmup_steps=4000,
        b1=0.9,
        b2=0.98,
        eps=1e-9,
        grad_clip_norm=0.0,  # 0 = no clipping (the paper does not clip)
    )

    cfg.train = dict(
        num_steps=100_000,
        # A time budget: stop (saving a checkpoint; `train` again goes on) once this invocation
        # has run this long, data preparation and compiling included; 0 = none.
        max_minutes=0.0,
        seed=0,
        label_smoothing=0.1,  # epsilon_ls
        # Token-level unlikelihood (tx.train.losses; Welleck et al. 2020) with this weight,
        # against repeating a token the reference does not repeat; 0 = none (the paper's).
        unlikelihood=0.0,
        micro_batches=1,  # gradient accumulation: each step = this many micro-batches
        # The loss forms the softmax logits piece by piece along the length axis, at most this
        # many (row, position) pairs per device at once, with the gradient in the same pass
        # (tx.train.losses.chunked_cross_entropy): float32 [tokens, V] logits never exist whole.
        # 0 = the plain loss over the whole logits (the reference the fused one is tested on);
        # -1 = per platform (tx.train.losses.chunk_tokens): 8192 on accelerators, on a CPU as
        # many as
        # keep a piece's logits within 32 MiB (262 at V = 32,000: 6-11% faster there).
        loss_chunk_tokens=-1,
        # The paper averages the last 5 checkpoints "written at 10-minute intervals": at its
        # 0.4 s/step that is every 1,500 steps. Averaging uses these step-spaced checkpoints
        # (and the last step), so the window spans the same 6,000 steps on any hardware; 0 =
        # every checkpoint counts. The time-based saves are for resuming only (the newest is kept).
        checkpoint_every_steps=1500,
        checkpoint_every_secs=600,  # safety saves against preemption; never averaged
        keep_checkpoints=20,  # step-spaced checkpoints kept: enough for big's last 20
        log_every_steps=100,
        eval_every_steps=5000,  # dev loss / perplexity; 0 = never
        eval_bleu_every_steps=0,  # dev BLEU during training; 0 = never
        # Keeping the best checkpoints by a dev score (tx.train.best; configs/small.py). The
        # paper keeps and averages the last ones: its dev score still rises when training ends.
        keep_best=0,  # the N best by best_metric, kept beside the last ones; 0 = off
        best_metric="dev_bleu",  # "dev_bleu" (eval_bleu_every_steps) | "dev_loss" (eval_every..)
        early_stopping_patience=0,  # stop after this many evaluations without a better one
        peak_tflops=0.0,  # per device, for MFU; 0 = look up by device kind
    )

    cfg.decode = dict(
        strategy="beam",  # "beam" (the paper) | "greedy" | "sample" (tx.infer.search)
        beam_size=4,
        alpha=0.6,  # GNMT length penalty ((5 + len) / 6)^alpha
        max_extra_len=50,  # output length <= input length + this
        max_length_ratio=0.0,  # > 0: also <= ceil(this * input length) + 10 (fairseq); 0 = off
        no_repeat_ngram_size=0,  # > 0: no n-gram of this size twice in an output (fairseq); 0 = off
        batch_tokens=4096,  # source tokens per decoding batch (before the beam)
        average_last=5,  # checkpoints averaged for the final model (base: 5, big: 20)
        average_which="last",  # "last" (the paper) | "best" by train.best_metric (train.keep_best)
        temperature=1.0,  # sample: softmax(logits / temperature)
        top_k=0,  # sample: only the k most likely tokens; 0 = all
        seed=0,  # sample: the random draws (folded with each batch's number)
    )

    cfg.mesh = dict(
        shape=dict(data=-1, fsdp=1, tensor=1),  # one -1 is filled from the device count
        rules=(  # logical axis -> mesh axes; first rule whose mesh axes are free wins
            ("batch", ("data", "fsdp")),
            ("vocab", "tensor"),
            ("heads", "tensor"),
            ("mlp", "tensor"),
            ("embed", "fsdp"),
            ("kv", None),
            ("length", None),
        ),
        # Several processes (hosts): one that sends no heartbeat for this long is taken for dead,
        # and every other process stops with an error instead of waiting on it for ever (JAX's
        # jax.distributed heartbeat; its default). A process that dies outright is noticed at
        # the next collective, sooner than this.
        heartbeat_timeout_secs=100,
    )

    cfg.reference = dict(  # the paper's figures for this configuration (for reports only)
        params_m=65.0,  # Table 3 "params" (millions)
        dev_ppl=4.92,  # Table 3, newstest2013 per-word-piece perplexity
        dev_bleu=25.8,  # Table 3, newstest2013
        test_bleu=27.3,  # Table 2, newstest2014, tokenized + compound-split
        train_cost_flops=3.3e18,  # Table 2: training time x GPUs x sustained FLOP/s per GPU
    )
    return cfg
