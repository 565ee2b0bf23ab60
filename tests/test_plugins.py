"""Plug-ins from the command line: a user's advantage method and credit scheme in a module outside the
package (written into tmp_path), imported by ``--plugin`` / a config's ``plugins:`` list before the
config is validated, and ``module:Class`` tasks in every command (mrtpo.plugins, mrtpo.tasks.load_task)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

from mrtpo import advantages, credit
from mrtpo.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "recipes" / "tiny_cpu.yaml"
SMALL = [  # the tiny recipe made smaller: 8 responses per step (2 prompts x G = 4), 6 tokens
    "--task.options.size=16",
    "--data.limit=16",
    "--trl.per_device_train_batch_size=8",
    "--trl.num_generations=4",
    "--trl.max_completion_length=6",
    "--trl.logging_steps=1",
    "--trl.report_to=[]",
    "--trl.disable_tqdm=true",
    "--model.tiny.hidden_size=32",
    "--threads=1",
]

# the user's module: one advantage method and one credit scheme, each logging its calls to $MY_EXT_LOG
USER_EXT = textwrap.dedent(
    '''
    import json
    import os

    import torch

    import mrtpo.advantages as adv
    import mrtpo.credit as credit


    def _log(kind, **kw):
        with open(os.environ["MY_EXT_LOG"], "a") as f:
            f.write(json.dumps({"kind": kind, **kw}) + "\\n")


    @adv.register("by_position")
    def by_position(b: adv.Batch, *, scale: adv.Positive = 1.0) -> torch.Tensor:
        """Â[j, k] = scale * w_k * (rank of j in its group - (G - 1) / 2), whatever the rewards."""
        rank = torch.zeros_like(b.r[:, 0])
        for g in range(b.num_groups):
            idx = (b.group == g).nonzero().flatten()
            rank[idx] = torch.arange(len(idx), dtype=b.r.dtype) - (len(idx) - 1) / 2
        out = scale * rank[:, None] * b.w()[None, :]
        _log("method", n=b.r.shape[0], out=out.tolist())
        return out


    def _gained(step, beta, options):  # the strength used: beta times the scheme's option `gain`
        _log("strength", options=dict(options))
        return beta * options["gain"]


    @credit.register_scheme("squared", replay="reward", options={"gain": 1.0}, strength=_gained)
    def squared(distances, mask, generator):  # [N, K, T], [N, T] -> weights [N, K, T]
        _log("scheme", shape=list(distances.shape))
        return credit.token_weights(distances**2, mask, credit="reward")
    '''
)


@pytest.fixture
def user_ext(tmp_path, monkeypatch):
    """``my_ext.py`` in a folder on sys.path (outside the package); its registrations, the module and the
    plug-in bookkeeping are undone afterwards (the registries are global)."""
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "my_ext.py").write_text(USER_EXT)
    log = tmp_path / "calls.jsonl"
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("MY_EXT_LOG", str(log))
    monkeypatch.setenv("MRTPO_PLUGINS", "")  # (recorded, so what verl_main exports is undone too)
    yield log
    sys.modules.pop("my_ext", None)
    for registry, name in ((advantages.ADVANTAGES, "by_position"), (credit.CREDIT_SCHEMES, "squared")):
        if name in registry.names():
            registry.remove(name)


def _normalized(x: np.ndarray) -> np.ndarray:
    """x / mean(x); 1 everywhere when the mean is 0 (a reward whose left-out segment is absent: C_-k = C)."""
    return x / x.mean() if x.mean() > 0 else np.ones_like(x)


def _calls(log: Path, kind: str) -> list[dict]:
    return [c for c in map(json.loads, log.read_text().splitlines()) if c["kind"] == kind]


def test_user_method_and_scheme_train_from_the_command_line(tmp_path, user_ext, capsys):
    pytest.importorskip("trl")  # not in the verl route's environment (requirements/gpu-verl.txt)
    out = tmp_path / "run"
    argv = [
        "train",
        str(TINY),
        *SMALL,
        "--method.method=by_position",
        "--method.options={scale: 0.5}",
        "--method.credit=squared",
        "--method.credit_beta=0.5",
        "--method.credit_options={gain: 0.5}",  # an option of the user's scheme
        "--trl.max_steps=2",
        f"--trl.output_dir={out}",
    ]
    # without the plug-in the names are unknown, and the error names the field
    assert main(argv) == 2
    assert "field 'method.method': 'by_position' is unknown" in capsys.readouterr().err
    assert main([*argv[:2], "--plugin", "my_ext", *argv[2:]]) == 0, capsys.readouterr().err

    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "loss" in r] == [1, 2]
    run = json.loads((out / "run.json").read_text())
    assert (run["method"]["method"], run["method"]["credit"]) == ("by_position", "squared")
    assert run["method"]["credit_options"] == {"gain": 0.5}  # --method.credit_options reached the scheme
    assert run["config"]["plugins"] == ["my_ext"]
    strength = _calls(user_ext, "strength")
    assert len(strength) == 2 and all(c["options"] == {"gain": 0.5} for c in strength)
    # the user's method ran on each step's 8 responses (plus the trainer's 2-row check at start-up):
    # G = 4, ranks -1.5 -0.5 0.5 1.5, times scale 0.5 -> -0.75 -0.25 0.25 0.75 per prompt, K = 5 rewards (the toy task's)
    method = [c for c in _calls(user_ext, "method") if c["n"] == 8]
    assert len(method) == 2
    expected = [[a] * 5 for a in (-0.75, -0.25, 0.25, 0.75) * 2]
    assert all(c["out"] == expected for c in method)
    # the user's scheme weighted the [8, 5, T] distances of both steps, once per step: the credit audit's
    # metrics (credit/<reward>/gini, ...) read the weights the allocation mixed
    scheme = _calls(user_ext, "scheme")
    assert len(scheme) == 2 and all(c["shape"][:2] == [8, 5] for c in scheme)
    # the logged token advantages are the allocation with the user's weights w = d² / mean d² and the
    # strength its option gives, b = β gain = 0.25: S_t = Σ_k Â_k ((1 - b) + b w_kt), and not MRTPO's own
    # w = d / mean d
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and {s["step"] for s in samples} == {1, 2}
    assert {s["credit_beta"] for s in samples} == {0.25}
    apart = 0.0
    for s in samples:
        adv = np.array(s["advantages"])
        assert adv.tolist() in expected  # the records carry the user's Â
        d = np.array(s["distances"])  # [K, T]: every pair is replayed (no Â is 0)
        s_user = sum(adv[k] * (0.75 + 0.25 * _normalized(d[k] ** 2)) for k in range(5))
        s_mrtpo = sum(adv[k] * (0.75 + 0.25 * _normalized(d[k])) for k in range(5))
        np.testing.assert_allclose(s["token_advantages"], s_user, rtol=1e-4, atol=1e-6)
        apart = max(apart, float(np.abs(s_user - s_mrtpo).max()))
    assert apart > 1e-3  # the check tells the two schemes apart


def test_plugins_list_in_a_yaml_config(tmp_path, user_ext, capsys):
    pytest.importorskip("trl")  # not in the verl route's environment (requirements/gpu-verl.txt)
    cfg = yaml.safe_load(TINY.read_text())
    cfg["plugins"] = ["my_ext"]
    cfg["method"].update(method="by_position", options={}, credit="squared")
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path), "--print-config"]) == 0, capsys.readouterr().err
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert resolved["plugins"] == ["my_ext"]
    assert (resolved["method"]["method"], resolved["method"]["credit"]) == (
        "by_position",
        "squared",
    )
    # --plugin on the command line adds to the list once; a bad list is named as the field
    from mrtpo.integrations.trl.recipe import load_config

    assert load_config(path, plugins=["my_ext"]).plugins == ["my_ext"]
    with pytest.raises(ValueError, match=r"field 'plugins': \{'a': 1\} is not a list of module names"):
        load_config(raw={**cfg, "plugins": {"a": 1}})


def test_missing_plugin_is_named(tmp_path, capsys):
    pytest.importorskip("trl")  # not in the verl route's environment (requirements/gpu-verl.txt)
    base = ["train", str(TINY), f"--trl.output_dir={tmp_path / 'run'}"]
    assert main([*base, "--plugin", "no_such_ext_xyz"]) == 2
    err = capsys.readouterr().err
    assert "plug-in 'no_such_ext_xyz' failed to import (ModuleNotFoundError" in err
    assert "is it on PYTHONPATH or in the current folder?" in err
    assert not (tmp_path / "run").exists()
    cfg = yaml.safe_load(TINY.read_text())
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({**cfg, "plugins": ["no_such_ext_xyz"]}))
    assert main(["train", str(path), "--print-config"]) == 2
    assert "invalid config: field 'plugins': plug-in 'no_such_ext_xyz' failed" in capsys.readouterr().err
    for cmd in (["explain", "--samples", "x"], ["bench", "train"]):  # the other commands name it too
        assert main([*cmd, "--plugin", "no_such_ext_xyz"]) == 2
        assert "plug-in 'no_such_ext_xyz' failed to import" in capsys.readouterr().err


def test_bad_plugin_code_is_named(tmp_path, monkeypatch):
    from mrtpo.plugins import import_plugin

    (tmp_path / "broken_ext.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"^plug-in 'broken_ext' failed to import \(RuntimeError: boom\)$"):
        import_plugin("broken_ext")
    with pytest.raises(ValueError, match=r"plug-in '.*nope\.py' failed to import \(FileNotFoundError"):
        import_plugin(str(tmp_path / "nope.py"))


TWO_WORDS = textwrap.dedent(
    """
    from mrtpo.prompt import Segment
    from mrtpo.tasks import Example, Task, Verdict, Verifier


    class Says(Verifier):
        def __init__(self, word):
            self.name = word

        def verdict(self, example, response):
            return Verdict(float(self.name in response.split()))


    class TwoWords(Task):
        name = "two_words"
        reward_names = ["apple", "river"]

        def verifiers(self, example):
            return [Says("apple"), Says("river")]

        def load(self, source=None, *, split="train", limit=None):
            segments = [Segment("say apple", rewards={"apple"}), Segment("say river", rewards={"river"})]
            return [Example(f"{split}-{i}", segments) for i in range(limit or 4)]
    """
)


def test_module_class_task_in_load_task_and_verl_data(tmp_path, monkeypatch, capsys):
    """``module:Class`` works where the built-in names do: load_task (explain, bench, verl's workers
    rebuilding the task from extra_info) and verl_data's --task."""
    from mrtpo.integrations.verl import adapter as va
    from mrtpo.integrations.verl import data as verl_data
    from mrtpo.integrations.verl import reward as verl_reward
    from mrtpo.tasks import load_task

    (tmp_path / "user_task_x.py").write_text(TWO_WORDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        task = load_task("user_task_x:TwoWords")
        assert task.reward_names == ["apple", "river"]
        with pytest.raises(ValueError, match=r"module 'user_task_x' has no 'Nope'"):
            load_task("user_task_x:Nope")
        with pytest.raises(ValueError, match=r"cannot import module 'no_such_pkg_q'"):
            load_task("no_such_pkg_q:Task")
        out = tmp_path / "data"
        rc = verl_data.main(
            ["--task", "user_task_x:TwoWords", "--val-split", "", "--limit", "3", "--out", str(out)]
        )
        assert rc == 0, capsys.readouterr().err
        import pyarrow.parquet as pq

        rows = pq.read_table(out / "train.parquet").to_pylist()
        assert len(rows) == 3
        rebuilt = va.task_from_extra_info(rows[0]["extra_info"])
        ex = va.example_from_extra_info(rows[0]["extra_info"])
        assert type(rebuilt).__name__ == "TwoWords"
        assert [v.score(ex, "river apple") for v in rebuilt.verifiers(ex)] == [1.0, 1.0]
    finally:
        sys.modules.pop("user_task_x", None)
        verl_reward._load_task.cache_clear()


def test_verl_entry_points_import_plugins(tmp_path, user_ext, monkeypatch, capsys):
    """verl_data takes --plugin; verl_main strips --plugin before Hydra, exports $MRTPO_PLUGINS (the Ray
    processes inherit it) and check_config imports it before the algorithm.mrtpo node is validated."""
    from omegaconf import OmegaConf

    from mrtpo.integrations.verl import data as verl_data
    from mrtpo.integrations.verl import main as verl_main

    rc = verl_data.main(["--plugin", "no_such_ext_xyz", "--task", "toy", "--out", str(tmp_path / "d")])
    assert rc == 2 and "plug-in 'no_such_ext_xyz' failed to import" in capsys.readouterr().err

    seen = {}

    def fake_hydra_main(**kw):
        return lambda fn: lambda: seen.update(argv=list(sys.argv))

    import hydra

    monkeypatch.setattr(hydra, "main", fake_hydra_main)
    monkeypatch.setattr(sys, "argv", ["verl_main"])
    verl_main.main(["--plugin", "my_ext", "algorithm.mrtpo.credit=squared", "--plugin=my_ext"])
    assert seen["argv"] == ["verl_main", "algorithm.mrtpo.credit=squared"]
    import os

    assert os.environ["MRTPO_PLUGINS"] == "my_ext" and "squared" in credit.CREDIT_SCHEMES.names()
    cfg = OmegaConf.create({"trainer": {"use_v1": False}, "algorithm": {"mrtpo": {"credit": "squared"}}})
    verl_main.check_config(cfg)  # the user's scheme validates
    from verl.trainer.ppo import core_algos

    from mrtpo.integrations.verl import adapter as va
    from mrtpo.integrations.verl import estimators as verl_estimators

    try:  # install() (every verl process, through verl_plugin) registers the user's method's estimator
        assert "mrtpo_by_position" in va.install()
        assert core_algos.get_adv_estimator_fn("mrtpo_by_position") is va.make_estimator("by_position")
    finally:
        core_algos.ADV_ESTIMATOR_REGISTRY.pop("mrtpo_by_position", None)
        verl_estimators._ESTIMATORS.pop("by_position", None)
    sys.modules.pop("my_ext", None)
    credit.CREDIT_SCHEMES.remove("squared")
    advantages.ADVANTAGES.remove("by_position")
    verl_main.check_config(cfg)  # imported again from $MRTPO_PLUGINS
    monkeypatch.setenv("MRTPO_PLUGINS", "")
    credit.CREDIT_SCHEMES.remove("squared")
    with pytest.raises(ValueError, match=r"algorithm.mrtpo.credit='squared' is unknown; known: "):
        verl_main.check_config(cfg)


def test_the_readme_extension_trains_with_plugin(tmp_path, monkeypatch, capsys):
    """docs/extending.md: its `centered` method and `squared` scheme, saved as a module of the user's, train
    one step with that page's command line (made small)."""
    pytest.importorskip("trl")  # not in the verl route's environment (requirements/gpu-verl.txt)
    import re

    readme = (ROOT / "docs" / "extending.md").read_text()
    start = readme.index("# Extending mrtpo")
    blocks = re.findall(r"```python\n(.*?)```", readme[start:], re.S)[:2]
    assert 'register("centered")' in blocks[0] and 'register_scheme("squared"' in blocks[1]
    (tmp_path / "readme_ext.py").write_text("\n".join(blocks))
    monkeypatch.syspath_prepend(str(tmp_path))
    cmd = re.search(r"mrtpo train (recipes/tiny_cpu.yaml --plugin my_ext .*?)#", readme[start:], re.S).group(
        1
    )
    args = cmd.replace("\\\n", " ").replace("my_ext", "readme_ext").split()
    args = [a.strip("'") for a in args]
    out = tmp_path / "run"
    try:
        rc = main(
            ["train", str(ROOT / args[0]), *args[1:], *SMALL, "--trl.max_steps=1", f"--trl.output_dir={out}"]
        )
        assert rc == 0, capsys.readouterr().err
        run = json.loads((out / "run.json").read_text())
        assert (run["method"]["method"], run["method"]["credit"]) == ("centered", "squared")
    finally:
        sys.modules.pop("readme_ext", None)
        for registry, name in ((advantages.ADVANTAGES, "centered"), (credit.CREDIT_SCHEMES, "squared")):
            if name in registry.names():
                registry.remove(name)
