"""The commands users run every day, on a tiny trained workdir."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tx.config import load_config
from tx.infer.translate import load_model


@pytest.fixture(scope="module")
def workdir(trained):
    return trained


def run_tx(root, *args, stdin=None):
    res = subprocess.run(
        [sys.executable, "-m", "tx", *args],
        cwd=root,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def test_translate_cli_reads_stdin_and_files(root, workdir, tmp_path):
    text = "The dog sees a cat.\n\nWe count three small birds.\n"
    out = run_tx(root, "translate", "--workdir", workdir, stdin=text)
    assert len(out.splitlines()) == 3 and out.splitlines()[1] == ""
    (tmp_path / "in.txt").write_text(text)
    run_tx(
        root,
        "translate",
        "--workdir",
        workdir,
        "--input",
        str(tmp_path / "in.txt"),
        "--output",
        str(tmp_path / "out.txt"),
    )
    assert (tmp_path / "out.txt").read_text() == out


def run_tx_fails(root, *args, stdin=None):
    """A command that must fail as a user error: exit 2, one line, no traceback."""
    res = subprocess.run(
        [sys.executable, "-m", "tx", *args], cwd=root, input=stdin, capture_output=True, timeout=600
    )
    err = res.stderr.decode()
    assert res.returncode == 2, err[-3000:]
    assert "Traceback" not in err and err.count("error: ") == 1, err[-3000:]
    return err


def test_translate_input_invalid_utf8_bom_and_crlf(root, workdir, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"The dog sees a cat.\nWe count \xff birds.\n")
    err = run_tx_fails(root, "translate", "--workdir", workdir, "--input", str(bad))
    assert f"error: {bad}:2: invalid UTF-8 at byte offset 29 " in err
    err = run_tx_fails(root, "translate", "--workdir", workdir, stdin=bad.read_bytes())
    assert "error: <stdin>:2: invalid UTF-8 at byte offset 29 " in err
    # A BOM and Windows line ends change nothing: the same translations as plain text.
    plain = "The dog sees a cat.\n\nWe count three small birds.\n"
    windows = tmp_path / "windows.txt"
    windows.write_bytes(b"\xef\xbb\xbf" + plain.replace("\n", "\r\n").encode())
    got = run_tx(root, "translate", "--workdir", workdir, "--input", str(windows))
    assert got == run_tx(root, "translate", "--workdir", workdir, stdin=plain)


def test_damaged_checkpoints_are_refused_by_name(root, workdir, tmp_path):
    from test_checkpoint import damage

    run = tmp_path / "run"
    shutil.copytree(workdir, run, ignore=shutil.ignore_patterns("averaged"))
    damage(str(run / "checkpoints" / "15"), "array data cut short")
    damage(str(run / "checkpoints" / "20"), "metadata overwritten")
    err = run_tx_fails(root, "translate", "--workdir", str(run), "--checkpoint", "15", stdin=b"x")
    assert f"error: {run}/checkpoints/15 cannot be restored (ValueError: " in err
    assert "choose another with --checkpoint STEP (available: [5, 10, 20])" in err
    err = run_tx_fails(root, "evaluate", "--workdir", str(run))  # the latest: 20
    assert f"error: {run}/checkpoints/20 cannot be restored (state/_METADATA is not JSON)" in err
    err = run_tx_fails(root, "average", "--workdir", str(run), "--last", "3")
    assert f"error: not averaging: {run}/checkpoints/15 cannot be restored (" in err
    assert f"; {run}/checkpoints/20 cannot be restored (state/_METADATA is not JSON)" in err
    assert sorted(os.listdir(run / "checkpoints")) == ["10", "15", "20", "5"]  # none moved


def test_average_then_evaluate_json(root, workdir):
    from tx.train.averaging import average

    avg = json.loads(run_tx(root, "average", "--workdir", workdir, "--last", "3").splitlines()[-1])
    assert avg["steps"] == [10, 15, 20]
    # Averaging again is a no-op (the same directory, not rewritten), and averaging other steps
    # replaces the averaged checkpoint. In this process: a `tx` process starts in about 7 s.
    cfg = load_config(os.path.join(workdir, "config.json"))
    path = os.path.join(workdir, "averaged", "20")
    before = os.stat(path)
    assert average(cfg, workdir, last=3) == (path, [10, 15, 20])
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert average(cfg, workdir, last=2) == (path, [15, 20])
    result = json.loads(
        run_tx(root, "evaluate", "--workdir", workdir, "--split", "test", "--json").splitlines()[-1]
    )
    assert {"bleu", "bleu_signature", "tok_bleu", "chrf", "num_sentences"} <= set(result)
    assert result["num_sentences"] == 500 and result["checkpoint"] == "averaged/20 (steps [15, 20])"
    with open(result["hypotheses_file"]) as f:
        assert len(f.read().splitlines()) == 500


def test_translate_with_a_missing_checkpoint_fails_clearly(root, workdir):
    res = subprocess.run(
        [sys.executable, "-m", "tx", "translate", "--workdir", workdir, "--checkpoint", "999"],
        cwd=root,
        input="x\n",
        capture_output=True,
        text=True,
    )
    assert res.returncode != 0 and "no checkpoint at step 999" in res.stderr


def test_dev_bleu_hook_scores_current_parameters(workdir):
    from tx.eval.evaluate import dev_bleu_hook, evaluate_split

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
def test_a_directory_that_is_not_a_run_is_named(root, tmp_path, tiny, command):
    # Even with --config given: the command needs what training wrote there.
    err = run_tx_fails(root, command, "--workdir", str(tmp_path), "--config", tiny.path)
    assert f"error: {tmp_path} is not a tx run (it has no config.json)" in err


def test_commands_without_a_workdir_say_so(root, tiny):
    for command in ("train", "translate"):
        err = run_tx_fails(root, command, "--config", tiny.path)
        assert f"error: {command} needs --workdir DIR" in err


def test_translate_cli_takes_another_search_strategy(root, workdir):
    text = "The dog sees a cat.\nWe count three small birds.\n"
    out = run_tx(
        root, "translate", "--workdir", workdir, "--config.decode.strategy=greedy", stdin=text
    )
    assert len(out.splitlines()) == 2


# Each command's own options (README's flags among them): `COMMAND --help` lists them all.
OWN_OPTIONS = {
    "info": ("--config", "--devices", "--workdir"),
    "train": (
        *("--config", "--workdir", "--take-over-lock"),
        *("--coordinator_address", "--num_processes", "--process_id"),
    ),
    "prepare": ("--config", "--workdir", "--take-over-lock"),
    "translate": (
        *("--workdir", "--checkpoint", "--input", "--output", "--nbest", "--alignments"),
        *("--align_layer", "--engine", "--model", "--device", "--compute_type", "--threads"),
    ),
    "average": ("--workdir", "--last", "--take-over-lock"),
    "evaluate": (
        *("--workdir", "--checkpoint", "--split", "--json", "--bootstrap", "--output"),
        *("--by-length", "--bucket_width", "--out", "--engine", "--model"),
    ),
    "export": ("--workdir", "--checkpoint", "--format", "--out", "--quantization"),
    "serve": ("--workdir", "--checkpoint", "--engine", "--model", "--host", "--port"),
    "attention": ("--workdir", "--checkpoint", "--text", "--out"),
    "plot": ("--workdir", "--out", "--positional", "--d_model"),
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
DISTINCT |= {"--take-over-lock", "--layouts"}


@pytest.mark.parametrize("command", sorted(OWN_OPTIONS))
def test_each_command_lists_its_own_options_only(root, command):
    res = subprocess.run(
        [sys.executable, "-m", "tx", command, "--help"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.startswith(f"usage: python -m tx {command} ")
    listed = set(re.findall(r"^ {2}(--[\w.-]+)", res.stdout, re.MULTILINE))
    listed |= set(re.findall(r", (--[\w.-]+)", res.stdout))  # --by-length, --by_length
    assert set(OWN_OPTIONS[command]) <= listed, set(OWN_OPTIONS[command]) - listed
    others = {o for c, own in OWN_OPTIONS.items() if c != command for o in own}
    foreign = (DISTINCT & others) - set(OWN_OPTIONS[command])
    assert not listed & foreign, listed & foreign


def test_global_options_before_the_command(root, tmp_path, tiny):
    # --workdir (and --config) may stand before the command; a command without one refuses it.
    err = run_tx_fails(root, f"--workdir={tmp_path}", "--config", tiny.path, "translate")
    assert f"error: {tmp_path} is not a tx run (it has no config.json)" in err
    err = run_tx_fails(root, f"--workdir={tmp_path}", "compile", "--config", tiny.path)
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


def test_the_command_is_found_after_global_options():
    from tx.__main__ import command_in

    assert command_in(["train", "--config", "configs/small.py"]) == "train"
    assert command_in(["--workdir=runs/a", "--config", "c.py", "train"]) == "train"
    assert command_in(["evaluate", "--workdir", "w", "--split", "train"]) == "evaluate"
    assert command_in(["--help"]) == ""
