"""The accelerator benchmark runs end to end before a device is lent (its --dry-run)."""

import json
import subprocess
import sys

import pytest


@pytest.mark.slow  # every benchmark of the accelerator script, dry: 40 s on 2 cores
def test_accelerator_script_dry_run_writes_every_figure(root, tmp_path):
    out = tmp_path / "accelerator.json"
    res = subprocess.run(
        ["bash", "benchmarks/accelerator.sh", "--dry-run", "--steps", "1", "--out", str(out)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PY": sys.executable, "PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["dry_run"] is True
    assert [c["case"] for c in result["train"]] == ["tiny/auto", "tiny/explicit"]
    for case in result["train"]:
        assert case["step_s"] > 0 and case["tokens_per_s"] > 0 and case["model_tflops_per_s"] > 0
        assert case["mfu"] is None or 0 < case["mfu"] < 1
        assert "peak_memory_bytes" in case
    assert [c["attention_impl"] for c in result["train"]] == ["xla", "explicit"]  # on a CPU
    assert result["decode"]["tokens_per_s"] > 0 and result["decode"]["beam"] == 4


def test_small_recipe_reads_a_budget_from_the_time_stamped_log(root, tmp_path, monkeypatch):
    """benchmarks/small_recipe.py: the steps a run had reached B minutes after its start, and
    the dev scores logged by then, from the lines `train` printed (EPOCH line)."""
    monkeypatch.syspath_prepend(str(root / "benchmarks"))
    import small_recipe

    log = tmp_path / "run.log"
    log.write_text(
        "1000 started python -m tx train ...\n"
        "1090 step 50/900 | loss 7.1 | lr 3e-04\n"
        "1200 step 100/900 | loss 5.8 | lr 6e-04\n"
        "1203 step 100: dev loss 5.594 | dev perplexity 627.17 | dev accuracy 0.139\n"
        "1290 step 150/900 | loss 5.3 | lr 9e-04\n"
        "1300 step 150: bleu 3.85 | tok_bleu 3.92\n"
    )
    start, steps, devs = small_recipe.timeline(str(log))
    assert start == 1000 and steps == [(1090, 50), (1200, 100), (1290, 150)]
    assert [(s, text.split(" |")[0]) for _, s, text in devs] == [
        (100, "dev loss 5.594"),
        (150, "bleu 3.85"),
    ]
    calls = []
    monkeypatch.setattr(small_recipe, "budget_workdir", lambda *a: calls.append(a) or "W")
    scores = {"bleu": 1, "chrf": 2, "tok_bleu": 3, "repetition_loops": 0, "num_sentences": 9}
    answers = {"average": {"steps": [50, 100]}, "evaluate": scores}
    monkeypatch.setattr(small_recipe, "tx", lambda cmd, *a: (json.dumps(answers[cmd]), 1.0))
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(
        json.dumps({"train": {"checkpoint_every_steps": 50}, "decode": {"average_last": 5}})
    )
    row = small_recipe.evaluate_budget(str(run), 4, start, steps, devs)  # 240 s: step 100
    assert row["step"] == 100 and calls[0][2:] == (100, 50, 5)
    assert row["dev"] == ["step 100: dev loss 5.594 | dev perplexity 627.17 | dev accuracy 0.139"]


def test_small_recipe_by_steps_reads_the_dev_losses_from_the_runs_tensorboard(
    root, tmp_path, monkeypatch
):
    """`--steps` has no log: each row's dev losses up to its step come from W/tensorboard/."""
    monkeypatch.syspath_prepend(str(root / "benchmarks"))
    import small_recipe

    from tx import workdir as wd
    from tx.train.events import Summaries

    summaries = Summaries(wd.tensorboard_dir(str(tmp_path)), enabled=True)
    for step, loss in ((200, 4.9921), (400, 3.7151), (600, 3.08)):
        summaries.scalars(step, {"dev/loss": loss, "train/loss": 9.0})
    summaries.close()
    assert small_recipe.dev_losses(str(tmp_path), 400) == [
        "step 200: dev loss 4.992",
        "step 400: dev loss 3.715",
    ]
