"""The tools laptop run: BFCL questions as tools-task rows (real rows of the bfcl-eval wheel), the warm
start's demonstrations and tokenizer, and, short, a warm start and a few `mrtpo train` steps of
recipes/tools_laptop.yaml from it."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from mrtpo.tasks.tools import ToolsTask, rows_to_examples, toolrl_system_prompt
from mrtpo.tasks.tools.bfcl_rows import (
    DEFAULT_CATEGORIES,
    bfcl_data_dir,
    load_bfcl_rows,
    split_rows,
    write_bfcl_splits,
)
from mrtpo.tasks.tools.warmstart import (
    FORMAT_WORDS,
    ToolsWarmStartConfig,
    build_tools_tokenizer,
    call_words,
    demonstration,
    main,
    text_words,
)

pytest.importorskip("bfcl_eval")
RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "tools_laptop.yaml"


def _scores(example, response: str) -> tuple[float, float]:
    fmt, corr = ToolsTask().verifiers(example)
    return fmt.score(example, response), corr.score(example, response)


def test_a_real_bfcl_row_becomes_a_row_whose_gold_call_scores_full_marks():
    row = load_bfcl_rows("simple_python")[0]
    assert row["id"] == "simple_python_0"
    # BFCL's answer: base [10], height [5], unit ["units", ""] ("" = optional, and unit is not required)
    gold = {"name": "calculate_triangle_area", "parameters": {"base": 10, "height": 5}}
    assert row["output"].splitlines()[1:] == ["<tool_call>", json.dumps(gold), "</tool_call>"]
    tool = json.loads((bfcl_data_dir() / "BFCL_v4_simple_python.json").read_text().splitlines()[0])[
        "function"
    ][0]
    assert row["instruction"] == toolrl_system_prompt([tool])
    assert row["input"] == (
        "**Dialogue Records History**\n<user> Find the area of a triangle with a base of 10 units and "
        "height of 5 units. </user>"
    )
    (ex,) = rows_to_examples([row])
    assert ex.meta["reference_calls"] == [gold]
    assert _scores(ex, row["output"]) == (1.0, 3.0)
    # a response with the unit given too (BFCL accepts it) matches 3 of the 4 parts: 6 * 3.75 / 4 - 3
    extra = {"name": gold["name"], "parameters": {**gold["parameters"], "unit": "units"}}
    response = f"<think> x </think>\n<tool_call>\n{json.dumps(extra)}\n</tool_call>"
    assert _scores(ex, response) == (1.0, pytest.approx(6 * (1 + 2 / 3 + 2) / 4 - 3))


def test_every_converted_gold_call_is_the_bfcl_evaluation_s_and_scores_full_marks():
    from mrtpo.eval.bfcl import ground_truth_calls, load_bfcl

    for category in DEFAULT_CATEGORIES:
        rows = load_bfcl_rows(category)
        examples = rows_to_examples(rows)
        entries = load_bfcl(category)
        assert [r["id"] for r in rows] == [e.id for e in entries]
        for ex, row, entry in zip(examples, rows, entries):
            assert ex.meta["reference_calls"] == [
                {"name": n, "parameters": a} for n, a in ground_truth_calls(entry)
            ]
            assert _scores(ex, row["output"]) == (1.0, 3.0)
    train, held = split_rows(load_bfcl_rows("multiple"))
    assert (len(train), len(held)) == (160, 40)
    assert [r["id"] for r in held[:2]] == ["multiple_4", "multiple_9"]


def _spaced(value) -> str:
    """A naive reference of the decoded demonstration: JSON with a space around each ``{}[]:,``."""
    if isinstance(value, dict):
        return "{ " + " , ".join(f"{json.dumps(k)} : {_spaced(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[ " + " , ".join(_spaced(v) for v in value) + " ]"
    return json.dumps(value)


def _copy_bfcl(tmp_path: Path, edit) -> Path:
    """A BFCL data folder with simple_python only, its line 3 (1-based) rewritten by ``edit``."""
    src = bfcl_data_dir()
    (tmp_path / "possible_answer").mkdir(parents=True)
    name = "BFCL_v4_simple_python.json"
    shutil.copy(src / "possible_answer" / name, tmp_path / "possible_answer" / name)
    lines = (src / name).read_text().splitlines()
    lines[2] = edit(json.loads(lines[2]))
    (tmp_path / name).write_text("\n".join(lines) + "\n")
    return tmp_path


CORRUPTIONS = {
    "two turns": (lambda q: json.dumps({**q, "question": q["question"] * 2}), "exactly one turn"),
    "no functions": (lambda q: json.dumps({**q, "function": []}), "'function' must be"),
    "no answer": (lambda q: json.dumps({**q, "id": "simple_python_x"}), "has no possible answer"),
    "not JSON": (lambda q: json.dumps(q)[:-1], None),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_a_malformed_row_is_a_one_line_error_naming_file_and_line(tmp_path, kind, capsys):
    edit, reason = CORRUPTIONS[kind]
    data = _copy_bfcl(tmp_path / "bfcl", edit)
    with pytest.raises(ValueError) as err:
        load_bfcl_rows("simple_python", data_dir=data)
    msg = str(err.value)
    assert "\n" not in msg and f"{data / 'BFCL_v4_simple_python.json'}:3" in msg
    if reason is not None:
        assert reason in msg and "simple_python_" in msg
    # the command says it in one line, with no traceback, before training anything
    with pytest.raises(SystemExit) as code:
        main(["--out", str(tmp_path / "out"), "--bfcl-data", str(data), "--categories", "simple_python"])
    assert code.value.code == 2
    err_text = capsys.readouterr().err
    assert (
        err_text.startswith("error: ")
        and err_text.count("\n") == 1
        and "BFCL_v4_simple_python.json:3" in err_text
    )
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_bad_ground_truth_names_the_question():
    from mrtpo.tasks.tools.bfcl_rows import bfcl_row

    q = {"id": "q7", "question": [[{"role": "user", "content": "hi"}]], "function": [{"name": "f"}]}
    with pytest.raises(ValueError, match=r"^F:9: question 'q7': ground_truth call 0 is not"):
        bfcl_row(q, {"id": "q7", "ground_truth": [{"f": [1]}]}, "F:9")
    with pytest.raises(ValueError, match=r"^F:9: question 'q7': its possible answer has id 'q8'"):
        bfcl_row(q, {"id": "q8", "ground_truth": [{"f": {}}]}, "F:9")


def test_tokenizer_keeps_newlines_and_demonstrations_score_as_intended():
    (ex,) = rows_to_examples(load_bfcl_rows("multiple")[:1])
    calls = ex.meta["reference_calls"]
    words = demonstration(calls, random.Random(0), p_break=0.0, p_wrong=0.0)
    tok = build_tools_tokenizer(sorted({w for w in words if w != "\n"}))
    vocab = tok.get_vocab()
    text = tok.decode([vocab[w] for w in words])
    (call,) = calls
    assert text == "<think> </think>\n<tool_call>\n" + _spaced(call) + "\n</tool_call>"
    # the names and values are the prompt's own words (the tokenizer splits the prompt's JSON the same way)
    prompt = set(text_words(" ".join(seg.text for seg in ex.segments if not seg.privileged)))
    assert set(call_words(call)) - prompt == {"«", "»"}
    assert _scores(ex, text) == (1.0, 3.0)
    (call,) = calls
    n = len(call["parameters"])
    assert n == 3
    # one of the n parameters left out: S = J(names) + J(keys) + (n - 1) equal values, S_max = 1 + 1 + n
    wrong_score = 6 * (1 + (n - 1) / n + (n - 1)) / (2 + n) - 3
    rng = random.Random(1)
    for _ in range(30):
        broken = demonstration(calls, rng, p_break=1.0, p_wrong=0.0)
        assert len(broken) == len(words) - 1
        assert _scores(ex, tok.decode([vocab[w] for w in broken]))[0] == 0.0  # one format token missing
        wrong = demonstration(calls, rng, p_break=0.0, p_wrong=1.0)
        assert _scores(ex, tok.decode([vocab[w] for w in wrong])) == (1.0, pytest.approx(wrong_score))
    assert FORMAT_WORDS.count("\n") == 3
    with pytest.raises(ValueError, match="p_wrong must be in"):
        ToolsWarmStartConfig(p_wrong=-0.1)


def test_write_bfcl_splits_is_what_the_task_loads(tmp_path):
    counts = write_bfcl_splits(tmp_path)
    assert counts == {"train": 320 + 160, "held_out": 80 + 40}  # simple_python 400 rows, multiple 200
    task = ToolsTask()
    held = task.load(str(tmp_path), split="held_out")
    assert len(held) == counts["held_out"] and held[0].meta["reference_calls"]
    train_ids = {r["id"] for r in json.loads((tmp_path / "train.json").read_text())}
    held_ids = {r["id"] for r in json.loads((tmp_path / "held_out.json").read_text())}
    assert not train_ids & held_ids and len(train_ids | held_ids) == 600


@pytest.mark.slow
def test_warm_start_then_train(tmp_path):
    """About 60 s on a loaded 2-core CPU: the format needs some 150 supervised steps to appear."""
    from mrtpo.cli.main import main as mrtpo

    warm = tmp_path / "warm"
    argv = ["--out", str(warm), "--categories", "simple_python", "--steps", "150", "--batch-size", "8"]
    assert main([*argv, "--eval-limit", "8", "--max-new-tokens", "40"]) == 0
    info = json.loads((warm / "warmstart.json").read_text())
    assert info["rows"] == {"train": 320, "held_out": 80}
    # measured: sampled format 0.38 on 8 train and on 8 held-out rows (3 of 8; the random model: 0); greedy
    # decoding still loops past 40 tokens at 150 steps (0.00). Correctness is -3: no call parses yet.
    assert info["train_sampled"]["format"] > 0.2 and info["held_out_sampled"]["format"] > 0.2
    assert info["train_sampled"]["correctness"] >= -3.0

    run = tmp_path / "run"
    argv = ["train", str(RECIPE), "--model.path", str(warm), "--data.source", str(warm / "data")]
    argv += ["--trl.output_dir", str(run), "--trl.max_steps", "4", "--trl.per_device_train_batch_size", "16"]
    argv += ["--trl.save_steps", "100"]
    assert mrtpo(argv) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    fmt = [r["rewards/format/mean"] for r in rows if "rewards/format/mean" in r]
    corr = [r["rewards/correctness/mean"] for r in rows if "rewards/correctness/mean" in r]
    assert len(fmt) == len(corr) == 4
    assert sum(fmt) / 4 > 0.1  # the random model scores 0
    # both rewards logged every step; correctness stays in its bounds (measured: -3, no call parses yet)
    assert all(-3.0 <= c <= 3.0 for c in corr)


def test_labelled_response_loss_is_response_loss():
    """The warm start's loss (LM head on the labelled positions only) against the full-logits loss."""
    import torch

    from mrtpo.models.sft import labelled_response_loss, response_loss
    from mrtpo.models.tiny import build_model

    model = build_model(50, hidden_size=32, seed=0, dtype=torch.float32)
    ids = torch.randint(3, 50, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # a left-padded prompt
    labels = torch.full_like(ids, -100)
    labels[:, 8:] = ids[:, 8:]
    labels[2, 11] = -100
    full, part = response_loss(model, ids, mask, labels), labelled_response_loss(model, ids, mask, labels)
    assert part.item() == pytest.approx(full.item(), rel=1e-5) and full.item() > 0
