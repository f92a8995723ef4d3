"""The commands users run every day, on a tiny trained workdir."""

import argparse
import io
import json
import logging
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from tx.__main__ import main
from tx.cli import COMMANDS
from tx.config import ConfigError, load_config
from tx.infer.translate import load_model

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def workdir(trained):
    return trained


def tx_in_process(capfd, monkeypatch, *args, stdin=None) -> tuple[int, str, str]:
    """`python -m tx ARGS` run here (tx.__main__.main: the command line without the malloc
    restart, whose exit status `python -m tx` exits with): (status, stdout, stderr). A process
    of its own would import TF and JAX again and compile its search afresh, about 7 s each.
    stderr is the process's: file descriptor 2 as well (capfd), and main's logging set-up
    (basicConfig: libraries' records to stderr), which pytest's own handlers would make a
    no-op. The one test that needs a process of its own, the pipe that stays open, starts one;
    so do test_commands_without_a_workdir_say_so and test_checkpoint's
    test_a_damaged_checkpoint_is_one_line_on_the_command_line, for the exit status."""
    if stdin is not None:
        data = stdin.encode() if isinstance(stdin, str) else stdin
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    capfd.readouterr()  # what came before is not the command's
    logger = logging.getLogger()
    handlers, level = logger.handlers, logger.level
    logger.handlers = []
    try:
        status = main(list(args))
    except SystemExit as e:  # argparse's --help
        status = e.code
    finally:
        logger.handlers = handlers
        logger.setLevel(level)
    out, err = capfd.readouterr()
    return status, out, err


@pytest.fixture
def run_tx(capfd, monkeypatch):
    """run_tx(*args, stdin=None) -> stdout of `python -m tx ARGS`, in this process
    (tx_in_process), which must succeed."""

    def run(*args, stdin=None) -> str:
        status, out, err = tx_in_process(capfd, monkeypatch, *args, stdin=stdin)
        assert status == 0, err[-3000:]
        return out

    return run


@pytest.fixture
def run_tx_fails(capfd, monkeypatch):
    """run_tx_fails(*args, stdin=None) -> stderr of `python -m tx ARGS` (in this process,
    tx_in_process), which must fail as a user error: status 2, one line, no traceback."""

    def run(*args, stdin=None) -> str:
        status, _, err = tx_in_process(capfd, monkeypatch, *args, stdin=stdin)
        assert status == 2, err[-3000:]
        assert "Traceback" not in err and err.count("error: ") == 1, err[-3000:]
        return err

    return run


def test_translate_cli_reads_stdin_and_files(run_tx, workdir, tmp_path):
    text = "The dog sees a cat.\n\nWe count three small birds.\n"
    out = run_tx("translate", "--workdir", workdir, stdin=text)
    assert len(out.splitlines()) == 3 and out.splitlines()[1] == ""
    (tmp_path / "in.txt").write_text(text)
    run_tx(
        "translate",
        "--workdir",
        workdir,
        "--input",
        str(tmp_path / "in.txt"),
        "--output",
        str(tmp_path / "out.txt"),
    )
    assert (tmp_path / "out.txt").read_text() == out


def test_translate_input_invalid_utf8_bom_and_crlf(run_tx, run_tx_fails, workdir, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"The dog sees a cat.\nWe count \xff birds.\n")
    err = run_tx_fails("translate", "--workdir", workdir, "--input", str(bad))
    assert f"error: {bad}:2: invalid UTF-8 at byte offset 29 " in err
    err = run_tx_fails("translate", "--workdir", workdir, stdin=bad.read_bytes())
    assert "error: <stdin>:2: invalid UTF-8 at byte offset 29 " in err
    # A BOM and Windows line ends change nothing: the same translations as plain text.
    plain = "The dog sees a cat.\n\nWe count three small birds.\n"
    windows = tmp_path / "windows.txt"
    windows.write_bytes(b"\xef\xbb\xbf" + plain.replace("\n", "\r\n").encode())
    got = run_tx("translate", "--workdir", workdir, "--input", str(windows))
    assert got == run_tx("translate", "--workdir", workdir, stdin=plain)


def test_damaged_checkpoints_are_refused_by_name(run_tx_fails, workdir, tmp_path):
    from test_checkpoint import damage

    run = tmp_path / "run"
    shutil.copytree(workdir, run, ignore=shutil.ignore_patterns("averaged"))
    damage(str(run / "checkpoints" / "15"), "array data cut short")
    damage(str(run / "checkpoints" / "20"), "metadata overwritten")
    err = run_tx_fails("translate", "--workdir", str(run), "--checkpoint", "15", stdin=b"x")
    assert f"error: {run}/checkpoints/15 cannot be restored (ValueError: " in err
    assert "choose another with --checkpoint STEP (available: [5, 10, 20])" in err
    err = run_tx_fails("evaluate", "--workdir", str(run))  # the latest: 20
    assert f"error: {run}/checkpoints/20 cannot be restored (state/_METADATA is not JSON)" in err
    err = run_tx_fails("average", "--workdir", str(run), "--last", "3")
    assert f"error: not averaging: {run}/checkpoints/15 cannot be restored (" in err
    assert f"; {run}/checkpoints/20 cannot be restored (state/_METADATA is not JSON)" in err
    assert sorted(os.listdir(run / "checkpoints")) == ["10", "15", "20", "5"]  # none moved


def test_average_then_evaluate_json(run_tx, workdir):
    from tx.train.averaging import average

    avg = json.loads(run_tx("average", "--workdir", workdir, "--last", "3").splitlines()[-1])
    assert avg["steps"] == [10, 15, 20]
    # Averaging again is a no-op (the same directory, not rewritten), and averaging other steps
    # replaces the averaged checkpoint (the library's calls: the command prints what they return).
    cfg = load_config(os.path.join(workdir, "config.json"))
    path = os.path.join(workdir, "averaged", "20")
    before = os.stat(path)
    assert average(cfg, workdir, last=3) == (path, [10, 15, 20])
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert average(cfg, workdir, last=2) == (path, [15, 20])
    # the tiny config's 50 test sentences
    args = ("--split", "test", "--json")
    result = json.loads(run_tx("evaluate", "--workdir", workdir, *args).splitlines()[-1])
    assert {"bleu", "bleu_signature", "tok_bleu", "chrf", "num_sentences"} <= set(result)
    assert result["num_sentences"] == 50 and result["checkpoint"] == "averaged/20 (steps [15, 20])"
    with open(result["hypotheses_file"]) as f:
        assert len(f.read().splitlines()) == 50


def test_translate_with_a_missing_checkpoint_fails_clearly(capfd, monkeypatch, workdir):
    args = ("translate", "--workdir", workdir, "--checkpoint", "999")
    status, _, err = tx_in_process(capfd, monkeypatch, *args, stdin="x\n")
    assert status != 0 and "no checkpoint at step 999" in err


def test_dev_bleu_hook_scores_current_parameters(workdir):
    from tx.eval.evaluate import dev_bleu_hook, evaluate_split

    # the tiny config's 50 dev sentences: 6 batches, each decoded the same both ways
    cfg = load_config(os.path.join(workdir, "config.json"))
    loaded = load_model(cfg, workdir)
    scores = dev_bleu_hook(cfg, workdir)(loaded.params)
    assert set(scores) == {"bleu", "tok_bleu"}
    full = evaluate_split(cfg, workdir, "dev", loaded, output=os.path.join(workdir, "dev.txt"))
    # Exact: the same parameters, sentences, batches and compiled decoder give the same
    # hypotheses, and the same strings give the same float64 scores.
    assert scores["bleu"] == full["bleu"]
    assert scores["tok_bleu"] == full["tok_bleu"]


@pytest.mark.parametrize("command", ["evaluate", "translate", "average"])
def test_a_directory_that_is_not_a_run_is_named(run_tx_fails, tmp_path, tiny, command):
    # Even with --config given: the command needs what training wrote there.
    err = run_tx_fails(command, "--workdir", str(tmp_path), "--config", tiny.path)
    assert f"error: {tmp_path} is not a tx run (it has no config.json)" in err


def test_commands_without_a_workdir_say_so(root, run_tx_fails, tiny):
    """`train` in a process of its own: `python -m tx` starts itself again with training's
    malloc tunables, and its exit status is main's (2, one line on stderr, no traceback)."""
    res = subprocess.run(
        [sys.executable, "-m", "tx", "train", "--config", tiny.path],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 2, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and res.stderr.count("error: ") == 1, res.stderr[-3000:]
    assert "error: train needs --workdir DIR" in res.stderr
    err = run_tx_fails("translate", "--config", tiny.path)
    assert "error: translate needs --workdir DIR" in err


def test_translate_cli_takes_another_search_strategy(run_tx, workdir):
    text = "The dog sees a cat.\nWe count three small birds.\n"
    out = run_tx("translate", "--workdir", workdir, "--config.decode.strategy=greedy", stdin=text)
    assert len(out.splitlines()) == 2


# Each command's own options (README's flags among them): `COMMAND --help` lists them all.
OWN_OPTIONS = {
    "info": ("--config", "--devices", "--workdir"),
    "train": (
        *("--config", "--workdir", "--take-over-lock"),
        *("--coordinator-address", "--num-processes", "--process-id"),
    ),
    "prepare": ("--config", "--workdir", "--take-over-lock"),
    "translate": (
        *("--workdir", "--checkpoint", "--input", "--output", "--nbest", "--alignments"),
        *("--align-layer", "--engine", "--model", "--device", "--compute-type", "--threads"),
        *("--beam", "--alpha", "--batch-tokens", "--max-tokens"),
    ),
    "average": ("--workdir", "--last", "--take-over-lock"),
    "evaluate": (
        *("--workdir", "--checkpoint", "--split", "--json", "--bootstrap", "--output"),
        *("--by-length", "--bucket-width", "--by-length-png", "--engine", "--model"),
        *("--src", "--ref", "--hyp", "--beam", "--alpha", "--batch-tokens"),
    ),
    "export": ("--workdir", "--checkpoint", "--format", "--out", "--quantization"),
    "import": ("--from-huggingface", "--workdir"),
    "serve": ("--workdir", "--checkpoint", "--engine", "--model", "--host", "--port", "--beam"),
    "attention": ("--workdir", "--checkpoint", "--text", "--out"),
    "plot": ("--workdir", "--out", "--positional", "--d-model"),
    "demo": ("--config", "--workdir"),
    "compile": ("--config", "--topology", "--layouts", "--json"),
    "reproduce": (
        *("--table", "--rows", "--root", "--plan", "--run", "--report", "--json"),
        *("--scale", "--steps", "--hardware", "--mfu", "--results"),
    ),
    "road": ("--results", "--root"),
    "card": ("--workdir", "--json"),
}
# Options that belong to one command or a few: no other command's --help shows them.
DISTINCT = {"--devices", "--nbest", "--last", "--bootstrap", "--quantization", "--port"}
DISTINCT |= {"--text", "--positional", "--topology", "--table", "--alignments", "--engine"}
DISTINCT |= {"--take-over-lock", "--layouts", "--from-huggingface", "--hyp", "--beam"}


@pytest.fixture(scope="module")
def parsers():
    from tx.cli.main import parsers

    return parsers()


def _sample(action) -> list[str]:
    """Arguments that give `action` a value other than its default."""
    from tx.cli import options

    if action.nargs == 0:
        return []
    if action.choices:
        return [str(next(c for c in action.choices if c != action.default))]
    value = {int: "2", options.positive_int: "2", float: "0.5", options.selector: "5"}
    return [value.get(action.type, "x")]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_one_option_spelling_defaults_and_choices(parsers, command):
    """--help of each command (in this process: parsing only) lists its own options, spelled
    with hyphens, each with its default and its choices; each `--a-b` also parses as `--a_b`
    (not shown), to the same namespace."""
    top, commands = parsers
    p = commands[command]
    text = p.format_help()
    assert text.startswith(f"usage: python -m tx {command} ")
    listed = set(re.findall(r"^ {2}(--[\w.-]+)", text, re.MULTILINE))
    listed |= set(re.findall(r", (--[\w.-]+)", text))  # --batch-tokens N, --max-tokens N
    assert set(OWN_OPTIONS[command]) <= listed, set(OWN_OPTIONS[command]) - listed
    others = {o for c, own in OWN_OPTIONS.items() if c != command for o in own}
    foreign = (DISTINCT & others) - set(OWN_OPTIONS[command])
    assert not listed & foreign, listed & foreign
    assert not [o for o in listed if "_" in o]
    required = []
    for action in p._actions:
        if action.required:
            required += [action.option_strings[0], *_sample(action)]
    for action in p._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or action.nargs == 0:
            continue
        formatter = p._get_formatter()
        formatter.add_argument(action)
        shown = " ".join(formatter.format_help().split())
        if action.default is not None:
            assert "default" in shown and str(action.default) in shown, shown
        for choice in action.choices or ():
            assert str(choice) in shown, shown
    for action in p._actions:
        for name in action.option_strings:
            if not name.startswith("--") or "-" not in name[2:] or name.startswith("--config"):
                continue
            if action.required:
                continue
            argv = [command, *required, name, *_sample(action)]
            alias = [command, *required, name.replace("-", "_").replace("__", "--", 1)]
            hyphens, underscores = top.parse_args(argv), top.parse_args(alias + argv[len(alias) :])
            assert vars(hyphens) == vars(underscores) != vars(top.parse_args([command, *required]))


def test_options_before_the_command_have_underscore_aliases_too(parsers):
    top, _ = parsers
    given = ["--workdir", "w", "--coordinator_address", "h:1", "--num_processes", "2", "train"]
    args = top.parse_args(given)
    assert (args.global_workdir, args.global_coordinator_address) == (["w"], "h:1")
    assert args.global_num_processes == 2 and args.num_processes is None
    # An abbreviation names one option, not an ambiguous pair (--num-processes, its alias).
    assert top.parse_args(["train", "--num", "3"]).num_processes == 3


def test_evaluate_shows_one_output_option(parsers):
    _, commands = parsers
    text = commands["evaluate"].format_help()
    assert "--output FILE" in text and not re.search(r"--out\b", text)
    # --out, what --by-length-png was called before, still parses (not shown).
    args = commands["evaluate"].parse_args(["--out", "p.png"])
    assert args.by_length_png == "p.png" and args.output is None


def test_global_options_before_the_command(run_tx_fails, tmp_path, tiny):
    # --workdir (and --config) may stand before the command; a command without one refuses it.
    err = run_tx_fails(f"--workdir={tmp_path}", "--config", tiny.path, "translate")
    assert f"error: {tmp_path} is not a tx run (it has no config.json)" in err
    err = run_tx_fails(f"--workdir={tmp_path}", "compile", "--config", tiny.path)
    assert "error: compile takes no --workdir" in err


def _tunables_seen(root, env, command="translate"):
    """What a program that calls with_malloc_tunables(command) sees as GLIBC_TUNABLES, printed
    once."""
    code = (
        "import os; from tx.__main__ import with_malloc_tunables; "
        f"with_malloc_tunables({command!r}); print(repr(os.environ.get('GLIBC_TUNABLES')))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


def test_the_command_line_starts_with_malloc_tunables_unless_tunables_are_set(root):
    """glibc reads GLIBC_TUNABLES only at start-up: `python -m tx` and train.py start
    themselves again once with huge pages on (and one arena to train), and keep any tunables
    of the user's own."""
    from tx.__main__ import HUGE_PAGES, TRAINING

    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    glibc = os.confstr("CS_GNU_LIBC_VERSION") if sys.platform == "linux" else ""
    name, _, version = (glibc or "").partition(" ")
    if name != "glibc" or tuple(map(int, version.split(".")[:2])) < (2, 35):
        assert _tunables_seen(root, env) == ["None"]
    else:  # once: the first run is gone
        assert _tunables_seen(root, env) == [repr(HUGE_PAGES)]
        assert _tunables_seen(root, env, "train") == [repr(TRAINING)]
    for command in ("translate", "train"):
        assert _tunables_seen(root, {**env, "GLIBC_TUNABLES": ""}, command) == ["''"]
    assert _tunables_seen(root, {**env, "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}) == [
        "'glibc.malloc.tcache_count=0'"
    ]


def test_the_restart_comes_before_jax_is_imported(root):
    """`python -m tx` decides its malloc tunables and starts itself again before it imports
    JAX: tx, tx.cli (the commands' names) and tx.__main__ import nothing heavy."""
    import tx

    assert "Transformer" in dir(tx) and tx.Transformer.__module__ == "tx.model.transformer"
    code = "import sys, tx, tx.cli, tx.__main__; print(sorted({'jax', 'flax'} & set(sys.modules)))"
    res = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert res.stdout.strip() == "[]", res.stdout + res.stderr


def test_translate_imports_only_what_it_uses(root):
    """What `translate` imports before its first sentence: no TensorFlow or torch (it reads
    no tf.data), no Pallas TPU kernels (tx.model.splash imports them when one is built) and
    not the demo corpus's number words (tx.data.sources imports them for the demo only)."""
    heavy = ["tensorflow", "torch", "jax.experimental.pallas.ops.tpu", "num2words"]
    code = (
        "import sys, tx.cli.main, tx.cli.translate, tx.infer.engines, tx.infer.translate; "
        f"print(sorted(set({heavy!r}) & set(sys.modules)))"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert res.stdout.strip() == "[]", res.stdout + res.stderr


def test_the_command_is_found_after_global_options():
    from tx.__main__ import command_in

    assert command_in(["train", "--config", "configs/small.py"]) == "train"
    assert command_in(["--workdir=runs/a", "--config", "c.py", "train"]) == "train"
    assert command_in(["evaluate", "--workdir", "w", "--split", "train"]) == "evaluate"
    assert command_in(["--help"]) == ""


def test_search_flags_are_the_decode_overrides(workdir):
    """--beam N, --alpha A and --batch-tokens N (or --max-tokens N) set what
    --config.decode.strategy=beam, .beam_size, .alpha and .batch_tokens set."""
    from tx.cli import main as cli
    from tx.cli import options
    from tx.config import split_config_args
    from tx.infer.engines import with_search

    def decode(command: str, *given: str) -> dict:
        rest, path, overrides = split_config_args([command, "--workdir", workdir, *given])
        args = cli.parsers()[0].parse_args(rest)
        cli._merge_global_options(args)
        cfg = cli._config(cli.MODULES[command], args, path, overrides)
        return with_search(cfg, **options.search_settings(args)).decode.to_dict()

    flags = ("--beam", "2", "--alpha", "0.3", "--max-tokens", "256")
    keys = ("strategy=beam", "beam_size=2", "alpha=0.3", "batch_tokens=256")
    for command in ("translate", "evaluate", "serve"):
        greedy = "--config.decode.strategy=greedy"  # --beam makes it a beam search
        expected = decode(command, *(f"--config.decode.{k}" for k in keys))
        assert decode(command, greedy, *flags) == expected != decode(command)
        assert decode(command, "--batch-tokens", "256")["batch_tokens"] == 256
    with pytest.raises(ConfigError, match="decode.alpha"):
        decode("translate", "--alpha", "-1")


def _evaluate(capsys, *args: str) -> dict:
    assert main(["evaluate", *args, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out.splitlines()[-1])


def test_evaluate_scores_given_translations_of_any_files(capsys, tmp_path):
    import sacrebleu

    refs = ["Der Hund sieht eine Katze.", "Wir zählen drei kleine Vögel.", "Das ist gut."]
    hyps = ["Der Hund sieht die Katze.", "Wir zählen drei Vögel.", "Das ist gut."]
    (tmp_path / "ref.de").write_text("".join(r + "\n" for r in refs))
    (tmp_path / "hyp.de").write_text("".join(h + "\n" for h in hyps))
    ref, hyp = str(tmp_path / "ref.de"), str(tmp_path / "hyp.de")
    same = _evaluate(capsys, "--hyp", ref, "--ref", ref)  # no run: base's config (de)
    # 100 up to float64 rounding: BLEU is exp of a sum of logarithms (100.00000000000004).
    assert same["bleu"] == sacrebleu.corpus_bleu(refs, [refs]).score == pytest.approx(100, 1e-14)
    assert same["tok_bleu"] == pytest.approx(100, 1e-14) and same["chrf"] == 100.0
    result = _evaluate(capsys, "--hyp", hyp, "--ref", ref)
    assert result["bleu"] == sacrebleu.corpus_bleu(hyps, [refs]).score
    assert result["chrf"] == sacrebleu.corpus_chrf(hyps, [refs]).score
    assert (result["hypotheses_file"], result["num_sentences"]) == (hyp, 3)
    for args, error in (
        (["--hyp", hyp], "evaluate needs --ref FILE with --src FILE (translated) or --hyp FILE"),
        (["--hyp", hyp, "--ref", ref, "--output", "o"], "--output writes translations"),
        (["--hyp", hyp, "--ref", str(tmp_path / "none")], "none"),
    ):
        assert main(["evaluate", *args]) == 2
        assert error in capsys.readouterr().err
    (tmp_path / "short.de").write_text(refs[0] + "\n")
    assert main(["evaluate", "--hyp", str(tmp_path / "short.de"), "--ref", ref]) == 2
    assert "short.de has 1 lines, " in capsys.readouterr().err


def test_evaluate_translates_and_scores_any_file(capsys, workdir, tmp_path):
    import sacrebleu

    import tx

    sources = ["The dog sees a cat.", "We count three small birds.", "I know two red cars."]
    refs = ["Der Hund sieht eine Katze.", "Wir zählen drei kleine Vögel.", "Ich kenne zwei Autos."]
    (tmp_path / "src.en").write_text("".join(s + "\n" for s in sources))
    (tmp_path / "ref.de").write_text("".join(r + "\n" for r in refs))
    out = str(tmp_path / "hyp.de")
    src, ref = str(tmp_path / "src.en"), str(tmp_path / "ref.de")
    result = _evaluate(capsys, "--workdir", workdir, "--src", src, "--ref", ref, "--output", out)
    with open(out) as f:
        hyps = f.read().splitlines()
    assert hyps == tx.load(workdir).translate(sources)
    assert result["bleu"] == sacrebleu.corpus_bleu(hyps, [refs]).score
    assert result["hypotheses_file"] == out and result["repetition_loops"] >= 0
    assert (
        main(["evaluate", "--workdir", workdir, "--src", src, "--ref", ref, "--split", "dev"]) == 2
    )
    assert "--split evaluates the run's split" in capsys.readouterr().err


def test_options_the_command_cannot_use_are_errors(capsys, workdir):
    for option in (["--device", "cuda"], ["--compute-type", "int8"], ["--threads", "2"]):
        assert main(["translate", "--workdir", workdir, *option]) == 2
        assert f"error: {option[0]}: for --engine ctranslate2 only" in capsys.readouterr().err
    assert main(["export", "--workdir", workdir]) == 2
    assert "the following arguments are required: --out" in capsys.readouterr().err
    assert main(["reproduce", "--plan"]) == 2
    assert "the following arguments are required: --table" in capsys.readouterr().err
    assert main(["reproduce", "--table", "5"]) == 2
    assert "argument --table: invalid choice: 5 (choose from 2, 3, 4)" in capsys.readouterr().err


def test_translate_streams_line_by_line(root, workdir, tmp_path, capsys):
    """From a pipe that stays open, each line's translation comes before the next line is
    written; the lines are those `translate --input` writes for the whole file."""
    import queue
    import threading

    lines = ["The dog sees a cat.", "", "We count three small birds.", "I know two red cars."]
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in lines))
    # --nbest 2: scores (the tiny run's best is often "") and indices counting input lines.
    args = ["translate", "--workdir", workdir, "--nbest", "2"]
    assert main([*args, "--input", str(tmp_path / "in.txt")]) == 0
    whole = capsys.readouterr().out.splitlines()
    per_line = [sum(out.startswith(f"{i}\t") for out in whole) for i in range(len(lines))]
    assert per_line == [2, 1, 2, 2]
    with open(tmp_path / "err.txt", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tx", *args],
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    arrived: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [arrived.put(out) for out in proc.stdout], daemon=True).start()
    streamed = []
    try:
        for line, n in zip(lines, per_line, strict=True):
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            for _ in range(n):  # the first waits for start-up, loading and compiling
                streamed.append(arrived.get(timeout=300).rstrip("\n"))
            assert arrived.empty()
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0, (tmp_path / "err.txt").read_text()[-3000:]
    finally:
        proc.kill()
    assert streamed == whole


def test_config_names_find_tx_own_configs(monkeypatch, tmp_path, tiny):
    from tx.cli.main import configs_dir, find_config

    own = configs_dir()
    assert os.path.samefile(own, ROOT / "configs")  # a source checkout: the repository's
    assert find_config("base") == find_config("base.py") == os.path.join(own, "base.py")
    assert find_config("table3.py:B1") == os.path.join(own, "table3.py") + ":B1"
    assert find_config(tiny.path) == tiny.path  # a path that exists is itself
    assert find_config("gs://bucket/configs/mine.py") == "gs://bucket/configs/mine.py"
    monkeypatch.chdir(tmp_path)  # outside the repository
    assert find_config("configs/tiny.py") == os.path.join(own, "tiny.py")
    assert find_config("mine/base.py") == "mine/base.py"  # a path: read_config says it is absent
    with pytest.raises(ConfigError, match=r"config file not found: bse \(tx's own configs: base,"):
        find_config("bse")


def test_the_package_lists_every_directory_of_tx():
    """pyproject.toml names the packages (configs/ is installed as tx.configs): every
    directory of tx with an __init__.py is one of them."""
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        setuptools = tomllib.load(f)["tool"]["setuptools"]
    found = {
        ".".join(path.relative_to(ROOT).parts[:-1]) for path in (ROOT / "tx").rglob("__init__.py")
    }
    assert set(setuptools["packages"]) == found | {"tx.configs"}
    assert setuptools["package-dir"] == {"tx.configs": "configs"}


def test_the_wheel_holds_the_configs_and_the_tx_script(tmp_path):
    """`pip wheel .` of the sources (copied: a build writes build/ beside pyproject.toml): tx's
    configs as tx/configs/*.py and the `tx` console script, what `python -m tx` runs."""
    import zipfile

    pytest.importorskip("setuptools")
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    for name in ("tx", "configs"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    res = subprocess.run(
        [*pip, "--no-index", "-q", "-w", str(tmp_path / "wheel"), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (wheel,) = (tmp_path / "wheel").iterdir()
    assert wheel.name.startswith("tx_transformer-")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = z.read(entry_points).decode()
    configs = {f"tx/configs/{p.name}" for p in (ROOT / "configs").glob("*.py")}
    assert configs and configs <= names
    assert "[console_scripts]\ntx = tx.__main__:entry" in scripts
    assert {"tx/__main__.py", "tx/api.py", "tx/paper/road/__init__.py"} <= names
