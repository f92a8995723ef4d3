"""The command line (`python -m tx COMMAND ...`, or the `tx` script): one module per command,
no logic of its own.

Each command is a module of this package, tx/cli/<command>.py (or MODULE_NAMES'): its options
(`add_options`), how it finds its config (`CONFIG`) and `run(args, cfg)`. tx.cli.main holds
what they share (the parser, the config, multi-process start-up, one-line errors),
tx.cli.options the option groups.

COMMANDS is the one list of the commands, in the order `python -m tx --help` lists them: a new
command is its module and one line here. This module imports nothing, so that tx/__main__.py
finds the command in its arguments before JAX is imported (it starts itself again first).

May import: every layer (it is the top one).
"""

# name -> what `python -m tx --help` says of it
COMMANDS = {
    "info": "parameter counts (actual and analytic, beside the paper's) as JSON; with "
    "--devices N also rows and real tokens per step on N devices",
    "train": "train (same as train.py)",
    "prepare": "the data once, before a multi-process train: vocabulary, token caches, run card",
    "translate": "translate stdin or --input to stdout or --output (--alignments: word links; "
    "--nbest N: n-best lists; --workdir W1 W2 ...: an ensemble; --engine ctranslate2)",
    "average": "average the last N checkpoints into a new one",
    "evaluate": "BLEU (sacreBLEU and the paper's tokenized BLEU) and chrF on a split of the "
    "run, or on any files (--src F --ref R: translated; --hyp H --ref R: given)",
    "export": "--format ctranslate2 --out DIR [--quantization int8]: a CTranslate2 model; "
    "--format huggingface: a MarianMTModel directory for transformers",
    "import": "--from-huggingface DIR: a MarianMTModel (OPUS-MT) directory as a new run",
    "serve": "an HTTP JSON translation server (POST /translate, GET /health)",
    "attention": "one sentence's attention maps (encoder, decoder, encoder-decoder) as PNGs",
    "plot": "learning curves of runs (--workdir W [W2 ...]), or --positional encodings",
    "demo": "the offline demo end to end: train, average, translate, score",
    "compile": "the train step compiled for a TPU slice or GPU node, deviceless: memory, step time",
    "reproduce": "the paper's Tables 2, 3, 4: --plan (default) what each row runs and costs, "
    "--run the unfinished rows, --report the tables from the runs",
    "road": "the road to the Transformer, measured: road digits | gradients | table1 | length",
    "card": "a run's card for a person: code, packages, hardware, data, time, scores",
}
# Command -> its module, where the two names differ: `import` is a Python keyword, and
# `attention` is tx.model.attention's name.
MODULE_NAMES = {"import": "import_", "attention": "draw_attention"}
