"""`mrtpo eval NAME`: dispatch through the benchmark registry, user plug-ins from outside the package,
the shared flags, and `python -m mrtpo`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mrtpo.cli.main import main
from mrtpo.eval import plugins
from mrtpo.eval.benchmark import BENCHMARKS

SRC = Path(__file__).resolve().parents[2] / "src"

# A user's evaluation, written as a user would in their own file: answers must be as long (in words) as
# the prompt asks. Nothing in the package knows it.
USER_PLUGIN = textwrap.dedent(
    """
    from mrtpo.eval.benchmark import Benchmark, Item, register_benchmark


    @register_benchmark("{name}")
    class WordCount(Benchmark):
        description = "answer in exactly N words"

        @classmethod
        def add_arguments(cls, parser):
            parser.add_argument("--max-n", type=int, default=3)

        def load(self):
            return [
                Item(f"q{{n}}", [{{"role": "user", "content": f"Say {{n}} words."}}], {{"n": n}})
                for n in range(1, self.args.max_n + 1)
            ]

        def score(self, items, responses):
            return [
                {{"id": it.id, "ok": len(responses[it.id].split()) == it.data["n"]}} for it in items
            ]

        def aggregate(self, verdicts):
            return {{"accuracy": sum(v["ok"] for v in verdicts) / len(verdicts), "n": len(verdicts)}}

        def format_report(self, report):
            return f"word count: {{100 * report['accuracy']:.1f}}% of {{report['n']}}"
    """
)


@pytest.fixture
def clean_registry(monkeypatch):
    """Registrations and imported plug-ins made by a test are undone after it."""
    monkeypatch.setattr(BENCHMARKS, "_entries", dict(BENCHMARKS._entries))
    monkeypatch.setattr(plugins, "_loaded", set(plugins._loaded))


def _write_plugin(folder: Path, module: str, name: str) -> Path:
    path = folder / f"{module}.py"
    path.write_text(USER_PLUGIN.format(name=name))
    return path


def test_builtins_are_registered():
    plugins.load_builtins()
    assert {"sql", "bfcl", "ifeval", "ifbench"} <= set(BENCHMARKS.names())


def test_user_plugin_module_by_name_and_env(tmp_path, monkeypatch, capsys, clean_registry):
    _write_plugin(tmp_path, "user_wc_mod", "user-wc")
    _write_plugin(tmp_path, "user_wc_env", "user-wc-env")
    monkeypatch.syspath_prepend(str(tmp_path))
    responses = tmp_path / "r.jsonl"
    # q1: 1 word (ok), q2: 3 words (wrong), q3: 3 words (ok), q4: 4 words (ok)
    answers = {"q1": "yes", "q2": "one two three", "q3": "a b c", "q4": "w x y z"}
    responses.write_text("".join(json.dumps({"id": k, "response": v}) + "\n" for k, v in answers.items()))
    out = tmp_path / "o.json"
    argv = ["eval", "user-wc", "--plugin", "user_wc_mod", "--responses", str(responses), "--max-n", "4"]
    assert main([*argv, "--output", str(out)]) == 0
    assert capsys.readouterr().out.strip() == "word count: 75.0% of 4"
    report = json.loads(out.read_text())
    assert report["benchmark"] == "user-wc" and report["metrics"] == {"accuracy": 0.75, "n": 4}
    assert [v["ok"] for v in report["predictions"]] == [True, False, True, True]
    # --plugin before NAME works too; --limit applies the default (first N items)
    assert (
        main(
            [
                "eval",
                "--plugin",
                "user_wc_mod",
                "user-wc",
                "--responses",
                str(responses),
                "--max-n",
                "4",
                "--limit",
                "2",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.strip() == "word count: 50.0% of 2"
    # a row that names no item is an error naming the file and line
    assert main(["eval", "user-wc", "--plugin", "user_wc_mod", "--responses", str(responses)]) == 2
    assert f"{responses}:4: 'q4' is not a prompt of user-wc" in capsys.readouterr().err
    # the environment variable imports a plug-in module as well
    monkeypatch.setenv("MRTPO_BENCHMARKS", "user_wc_env")
    assert main(["eval", "user-wc-env", "--responses", str(responses), "--max-n", "4"]) == 0
    assert "75.0%" in capsys.readouterr().out


def test_user_plugin_generates_and_rescores(tmp_path, tiny_tokenizer, tiny_model, capsys, clean_registry):
    model = tmp_path / "model"
    tiny_tokenizer.save_pretrained(model)
    tiny_model.save_pretrained(model)
    plugin = _write_plugin(tmp_path, "user_wc_gen", "user-wc-gen")
    saved, first, second = tmp_path / "saved.jsonl", tmp_path / "a.json", tmp_path / "b.json"
    argv = [
        "eval",
        "user-wc-gen",
        "--plugin",
        str(plugin),
        "--model",
        str(model),
        "--backend",
        "transformers",
    ]
    argv += ["--max-new-tokens", "3", "--save-responses", str(saved), "--output", str(first)]
    assert main(argv) == 0
    rows = [json.loads(x) for x in saved.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["q1", "q2", "q3"] and all(isinstance(r["response"], str) for r in rows)
    argv = [
        "eval",
        "user-wc-gen",
        "--plugin",
        str(plugin),
        "--responses",
        str(saved),
        "--output",
        str(second),
    ]
    assert main(argv) == 0
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    assert a["predictions"] == b["predictions"] and a["metrics"] == b["metrics"]
    assert a["sampling"]["max_new_tokens"] == 3 and b["sampling"] is None


def test_vllm_backend_through_a_double_of_vllm(
    tmp_path, tiny_tokenizer, tiny_model, capsys, clean_registry, monkeypatch
):
    """``--backend vllm`` runs through its code path (``VLLMGenerator``: ``vllm.LLM``, ``SamplingParams``,
    ``LLM.chat``) with a test double of the ``vllm`` module generating through the Hugging Face model
    (tests/integrations/trl/vllm_double.py): greedy responses equal the transformers backend's."""
    from tests.integrations.trl import vllm_double as vd

    model = tmp_path / "model"
    tiny_tokenizer.save_pretrained(model)
    tiny_model.save_pretrained(model)
    plugin = _write_plugin(tmp_path, "user_wc_vllm", "user-wc-vllm")
    argv = ["eval", "user-wc-vllm", "--plugin", str(plugin), "--model", str(model), "--max-new-tokens", "4"]
    argv += ["--max-n", "5", "--output"]
    assert main([*argv, str(tmp_path / "hf.json"), "--backend", "transformers"]) == 0
    assert main(["eval", "user-wc-vllm", "--model", str(model), "--backend", "vllm"]) == 2  # no vllm here
    assert "vllm is not installed" in capsys.readouterr().err
    vd.install_vllm_module(monkeypatch)
    assert main([*argv, str(tmp_path / "vllm.json"), "--backend", "vllm", "--dtype", "float32"]) == 0
    hf, vl = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("hf", "vllm"))
    assert any(p["ok"] is False for p in hf["predictions"])  # responses of a random model, not all alike
    assert vl["predictions"] == hf["predictions"] and vl["metrics"] == hf["metrics"]
    (llm,) = vd.FakeLLM.instances
    assert llm.kwargs == {"model": str(model), "seed": 0, "dtype": "float32"}
    (gen,) = llm.engine.generations
    assert gen.prompts == 5 and gen.params["max_tokens"] == 4 and gen.params["temperature"] == 0.0
    assert gen.params["top_k"] == 0 and gen.params["top_p"] == 1.0 and gen.params["seed"] == 0
    # --backend auto picks vLLM only on a GPU
    from mrtpo.eval.generation import TransformersGenerator, make_generator

    assert isinstance(make_generator(str(model), backend="auto"), TransformersGenerator)


def test_eval_errors(tmp_path, capsys, clean_registry):
    assert main(["eval"]) == 2
    assert (
        "mrtpo eval: error: name a benchmark: advancedif, bfcl, ifbench, ifeval, muldimif, sql"
        in capsys.readouterr().err
    )
    assert main(["eval", "nope", "--responses", "x"]) == 2
    err = capsys.readouterr().err
    assert "mrtpo eval nope: error: unknown benchmark 'nope'; known: " in err and "ifbench" in err
    assert main(["eval", "sql", "--plugin", "no_such_module_xyz", "--responses", "x"]) == 2
    assert (
        "benchmark plug-in 'no_such_module_xyz' failed to import (ModuleNotFoundError"
        in capsys.readouterr().err
    )
    assert main(["eval", "sql", "--responses", str(tmp_path / "none.txt")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["eval", "sql", "--model", "m", "--responses", "r"]) == 2
    assert "give exactly one of --model" in capsys.readouterr().err
    assert main(["eval", "sql", "--responses", "r", "--save-responses", "s"]) == 2
    assert "--save-responses needs --model" in capsys.readouterr().err
    assert main(["eval", "sql", "--responses", "r", "--limit", "0"]) == 2
    assert "--limit must be >= 1" in capsys.readouterr().err


def test_python_dash_m_mrtpo_from_outside_the_package(tmp_path):
    """`python -m mrtpo` runs the CLI; a plug-in file outside the package is found with --plugin."""
    plugins.load_builtins()
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("MRTPO_BENCHMARKS", None)
    help_out = subprocess.run(
        [sys.executable, "-m", "mrtpo", "eval", "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert help_out.returncode == 0
    listed = help_out.stdout.split("benchmarks:\n", 1)[1].split("\n\n", 1)[0]
    assert [line.split()[0] for line in listed.splitlines()] == sorted(BENCHMARKS.names())
    plugin = _write_plugin(tmp_path, "outside_plugin", "outside")
    (tmp_path / "r.jsonl").write_text('{"id": "q1", "response": "one"}\n{"id": "q2", "response": "x"}\n')
    run = subprocess.run(
        [sys.executable, "-m", "mrtpo", "eval", "outside", "--plugin", str(plugin), "--responses", "r.jsonl",
         "--max-n", "2"],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "word count: 50.0% of 2"
    # as the `mrtpo` console script runs (the current folder is not on sys.path): a module name next to
    # the user is found
    script = tmp_path / "bin" / "mrtpo_script.py"
    script.parent.mkdir()
    script.write_text("import sys\nfrom mrtpo.cli.main import main\nsys.exit(main())\n")
    run = subprocess.run(
        [sys.executable, str(script), "eval", "outside", "--plugin", "outside_plugin", "--responses", "r.jsonl",
         "--max-n", "2"],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "word count: 50.0% of 2"


def test_entry_point_plugins(tmp_path, monkeypatch, clean_registry):
    """An installed package's entry point in the group `mrtpo.benchmarks` names the module to import."""
    import importlib.metadata

    _write_plugin(tmp_path, "user_wc_ep", "user-wc-ep")
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = importlib.metadata.EntryPoint(
        name="wc", value="user_wc_ep:WordCount", group=plugins.ENTRY_POINT_GROUP
    )
    real = importlib.metadata.entry_points
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda **kw: [ep] if kw.get("group") == plugins.ENTRY_POINT_GROUP else real(**kw),
    )
    assert plugins.entry_point_modules() == ["user_wc_ep"]
    assert "user-wc-ep" not in BENCHMARKS
    plugins.load_all()
    assert BENCHMARKS.get("user-wc-ep").description == "answer in exactly N words"


def test_a_dataset_or_a_typo_for_a_benchmark_gets_a_hint(capsys):
    """`mrtpo eval spyder` (a dataset, misspelled) points to the benchmark that scores it; a typo of a
    benchmark gets the nearest name."""
    from mrtpo.cli.main import main

    assert main(["eval", "spyder"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "spider is scored by 'sql': mrtpo eval sql --data FOLDER" in err
    assert main(["eval", "bfcll"]) == 2
    assert "(did you mean 'bfcl'?)" in capsys.readouterr().err
