"""The step model's structure: padding as TRL pads, the reference model when beta > 0, server-mode generation
inside the step, each replay kind's rows asked of the kind, and the CPU profile measured once and cached."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mrtpo.plan import device
from mrtpo.plan.cost import expected_max, padded, replay_work, step, weight_sync_seconds
from mrtpo.plan.memory import memory, reference_bytes
from mrtpo.plan.setup import Reward, TaskProfile
from tests.plan.test_memory import hand

THREE = TaskProfile(
    rollout_tokens=20, prompt_max=20, response_tokens=10, privileged_tokens=0, shared_prefix=0,
    rewards=(Reward("a", 4, pass_rate=0.5), Reward("b", 6, pass_rate=0.5), Reward("c", 2, active=0.0)),
    note="by hand",
)  # fmt: skip


def three(**changes):
    base = dict(profile=THREE, rollout_tokens=20, prompt_max=20, response_tokens=10, max_completion=10, group=2,
                old_logprob_pass=False)  # fmt: skip
    return hand(**{**base, **changes})


def test_expected_longest_prompt_by_hand():
    # two draws from {10, 20}: the longest is 10 only when both are (1/4)
    assert expected_max([10, 20], 2) == pytest.approx(0.25 * 10 + 0.75 * 20)
    assert expected_max([7, 7, 7], 5) == 7 and expected_max([3, 9], 1) == pytest.approx(6)


def test_padding_raises_the_cost_as_predicted():
    s = hand(prompt_max=30, rollout_tokens=10)  # the profile's longest prompt pads every pass
    assert padded(s) == (30.0, 6.0)
    wide = step(s, memory(s)).phases["training"]["tflop"]
    narrow = step(hand(), memory(hand())).phases["training"]["tflop"]  # padded to 10 + 6
    # training FLOPs: 4 responses x (4 forwards over the padded row + the head), the row 36 vs 16 tokens
    from mrtpo.plan.cost import forward_flops

    head = 4 * 4 * 6 * 2 * 64000
    assert wide * 1e12 == pytest.approx(4 * 4 * forward_flops(s, 36, 18, 0) + head)
    assert narrow * 1e12 == pytest.approx(4 * 4 * forward_flops(s, 16, 8, 0) + head)
    # with the data's prompt lengths: the expected longest of the batch's 4 / G = 2 distinct prompts
    data = hand(prompt_lengths=(10, 30))
    assert padded(data)[0] == pytest.approx(0.25 * 10 + 0.75 * 30)


def test_beta_adds_the_reference_forward_and_its_weights():
    base = step(hand(), memory(hand()))
    kl = hand(beta=0.04)
    st, mem = step(kl, memory(kl)), memory(kl)
    assert "reference" not in base.phases
    assert (
        st.phases["reference"] == base.phases["rollout pass"]
    )  # one forward of every response, as the rollout's
    assert st.seconds == pytest.approx(base.seconds + base.phases["rollout pass"]["seconds"])
    # a bf16 copy sharded as the policy under ZeRO-3: 2 P / n + a gathered module (2 L_max)
    assert reference_bytes(kl) == mem.parts["reference"] == 2 * 138304 // 2 + 2 * 64000
    assert reference_bytes(hand()) == 0 and reference_bytes(hand(beta=0.04, sharding="ddp")) == 2 * 138304


def test_each_kind_costs_its_own_rows():
    # rewards a and b active with 1 - 2 x 0.5^2 = 0.5 each, c never; no privileged segment and no rollout pass:
    # C (20 tokens) runs whenever a row runs; contexts C_-a = 16, C_-b = 14, C_-all = 8; + T - 1 = 9 each
    reward = replay_work(three(credit="reward"))
    assert reward.active == pytest.approx(1.0)
    # rows: a (0.5) + b (0.5) + C (P(a or b) = 0.75)
    assert reward.rows == pytest.approx(0.5 + 0.5 + 0.75)
    assert reward.tokens == pytest.approx(0.5 * 25 + 0.5 * 23 + 0.75 * 29)
    joint = replay_work(three(credit="joint"))  # one row, C_-all, when any reward is active
    assert joint.rows == pytest.approx(0.75 * 2) and joint.tokens == pytest.approx(0.75 * (17 + 29))
    cort = replay_work(three(credit="cort"))  # one row (relevance) on the same contexts
    assert cort.rows == joint.rows and cort.tokens == joint.tokens and cort.scorer_fpe == 0
    p2t = replay_work(three(credit="p2t"))  # the reward rows, plus a scorer's forward and backward per row
    assert p2t.tokens == reward.tokens and p2t.scorer_fpe == pytest.approx(3 * (0.5 + 0.5))
    # RLSD compares C with the rollout prompt: the same here (no privileged segment), so nothing runs
    assert replay_work(three(credit="rlsd")).rows == 0
    assert replay_work(three(credit="none")).rows == 0 and not three(credit="none").replays
    # with the rollout pass, C's forward is reused (its row is still projected)
    reused = replay_work(three(credit="reward", old_logprob_pass=True))
    assert reused.tokens == pytest.approx(0.5 * 25 + 0.5 * 23) and reused.rows == reward.rows
    costs = {
        c: step(three(credit=c), memory(three(credit=c))).phases["replay"]["tflop"]
        for c in ("reward", "joint")
    }
    assert costs["joint"] < costs["reward"]


def test_server_generation_is_inside_the_step_with_the_weight_sync():
    s = hand(vllm="server", gpus=3, processes=2, vllm_share=0.9)
    st = step(s, memory(s))
    assert st.phases["generation"]["seconds"] > 0
    sync = weight_sync_seconds(s)
    # ZeRO-3: one gather per parameter tensor (2 layers x 12 with Qwen2's biases + embedding + norm), 2 P bytes
    # at 100 GB/s and 0.2 ms each, then the broadcast to the server at the same rates
    one = 2 * 138304 / 100e9 + 26 * 2e-4
    assert sync == pytest.approx(2 * one)
    assert weight_sync_seconds(hand()) == 0  # transformers' generate: no engine to sync
    # the server generates every process's rows: twice the decode FLOPs of one process's share
    coloc = hand(vllm="colocate", vllm_share=0.5)
    assert st.phases["generation"]["tflop"] == pytest.approx(
        2 * step(coloc, memory(coloc)).phases["generation"]["tflop"]
    )


FAKE = device.CpuProfile(  # a test double of a measured profile: 100 GFLOP/s, 10 GB/s, 1 ms per layer call
    threads=1, matmul_gflops={128: 100.0, 2048: 100.0}, decode_gflops={128: 50.0, 2048: 50.0}, bandwidth_gbs=10.0,
    layer_call_s={64: 1e-3, 1024: 1e-3}, decode_step_s=2e-3, cpu="test", torch="test", measured_at="test",
)  # fmt: skip


def test_the_cpu_profile_is_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []

    def fake_measure(threads):  # a test double of the measurement
        calls.append(threads)
        return dataclasses.replace(FAKE, threads=threads)

    monkeypatch.setattr(device, "measure_cpu", fake_measure)
    prof, path, fresh = device.cpu_profile(3)
    assert fresh and calls == [3] and path.is_file() and path.parent == tmp_path / "mrtpo" / "device"
    again, path2, fresh2 = device.cpu_profile(3)
    assert not fresh2 and calls == [3] and path2 == path and again == prof  # read back, not measured
    assert json.loads(path.read_text())["bandwidth_gbs"] == 10.0
    device.cpu_profile(1)
    assert calls == [3, 1]  # another thread count is another profile
    device.cpu_profile(3, refresh=True)
    assert calls == [3, 1, 3]
    with pytest.raises(ValueError, match="--threads must be >= 1"):
        device.cpu_profile(0)


def test_a_cpu_step_uses_the_measured_rates():
    s = hand(
        cpu=FAKE, sharding="ddp", processes=1, gpus=1, responses_per_step=4, vllm=None, weights_dtype_bytes=4
    )
    st = step(s, memory(s))
    r = FAKE.rates(s.shape.hidden)
    assert (r.matmul, r.decode_matmul, r.bandwidth, r.layer_call) == (100e9, 50e9, 10e9, 1e-3)
    from mrtpo.plan.cost import forward_flops
    from mrtpo.plan.memory import layer_activation_bytes

    # the rollout pass: 4 rows of 16 tokens in 2 micro-batches: FLOPs at 100 GFLOP/s, the element-wise bytes
    # (float32: twice the bf16 formula) written and read twice at 10 GB/s, 2 x 2 layer calls of 1 ms
    f = 4 * forward_flops(s, 16, 8, 6)
    elem = 4 * 64 * 2 * layer_activation_bytes(s.shape) * 2 / 10e9
    assert st.phases["rollout pass"]["seconds"] == pytest.approx(f / 100e9 + elem + 4e-3)
    assert st.rates.startswith("this CPU at 1 thread(s)")


def test_attention_and_a_decode_layer_calls_positions_at_their_measured_rates():
    # the same profile with causal attention at 25 GFLOP/s at 16 positions and 50 at 64 (log-linear
    # between), and 1 us more per decode layer call per position attended
    prof = dataclasses.replace(
        FAKE, attention_gflops={16: 25.0, 64: 50.0}, layer_position_s={64: 1e-6, 1024: 1e-6}
    )
    s = hand(
        cpu=prof, sharding="ddp", processes=1, gpus=1, responses_per_step=4, vllm=None, weights_dtype_bytes=4
    )
    base = dataclasses.replace(s, cpu=FAKE)
    r = prof.rates(s.shape.hidden)
    assert r.attention_rate(16) == pytest.approx(25e9) and r.attention_rate(32) == pytest.approx(37.5e9)
    assert r.attention_rate(1000) == pytest.approx(50e9)  # clamped at the longest length measured
    assert FAKE.rates(s.shape.hidden).attention_rate(16) == 100e9  # no table: the matmul rate
    from mrtpo.plan.cost import forward_flops, forward_seconds

    # a forward of 16 tokens attending to 8 positions on average: attention 16 x 4 x layers x q_dim x 8 FLOPs
    attention = 16 * 4 * s.shape.layers * s.shape.q_dim * 8
    rest = forward_flops(s, 16, 8, 6) - attention
    assert forward_seconds(s, r, 16, 8, 6) == pytest.approx(rest / 100e9 + attention / 25e9)
    # the rollout pass: 4 rows, one forward each; the rest of the pass as with the profile without them
    gap = (
        step(s, memory(s)).phases["rollout pass"]["seconds"]
        - step(base, memory(base)).phases["rollout pass"]["seconds"]
    )
    assert gap == pytest.approx(4 * attention * (1 / 25e9 - 1 / 100e9))
    # generation: each decode iteration's layer calls pay for the padded prompt and half the padded completion
    from mrtpo.plan.cost import padded

    p_pad, t_pad = padded(s)
    st, sb = step(s, memory(s)), step(base, memory(base))
    prefill_attention = 4 * p_pad * 4 * s.shape.layers * s.shape.q_dim * p_pad / 2
    gen_gap = st.phases["generation"]["seconds"] - sb.phases["generation"]["seconds"]
    want = prefill_attention * (1 / r.attention_rate(p_pad) - 1 / 100e9)
    want += t_pad * s.shape.layers * 1e-6 * (p_pad + t_pad / 2)
    assert gen_gap == pytest.approx(want)


def test_plan_device_cpu_reads_a_tiny_recipes_data_and_the_cached_profile(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    from mrtpo.cli.main import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = device.cache_path(1)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(dataclasses.asdict(FAKE)))  # the test double, as if measured before
    monkeypatch.setattr(
        device, "measure_cpu", lambda threads: pytest.fail("the cached profile was not reused")
    )
    recipe = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_cpu.yaml")
    argv = [
        "plan",
        recipe,
        "--device",
        "cpu",
        "--threads",
        "1",
        "--json",
        "--",
        "--trl.max_completion_length",
        "40",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    st = out["step"]
    assert (
        out["processes"] == 1
        and out["sharding"] == "ddp"
        and st["rates"] == "this CPU at 1 thread(s), measured test"
    )
    assert st["padded_completion_tokens"] == 40 and 0 < st["padded_prompt_tokens"] < 40  # the data's prompts
    assert set(st["phases"]) == {
        "generation",
        "replay",
        "training",
    }  # no vLLM, beta 0: no rollout or reference pass
    assert any("cached" in n for n in out["notes"]) and out["errors"]["time"].startswith(
        "CPU: measured rates"
    )
    # the toy task's 5 rewards read from its data (the profile names 4)
    assert len(out["assumptions"]["active_shares"]) == 5
    # --refresh-profile measures this CPU again (a profile is of the load it was measured under) and caches it
    calls = []
    monkeypatch.setattr(device, "measure_cpu", lambda threads: calls.append(threads) or dataclasses.replace(
        FAKE, measured_at="again"))  # fmt: skip
    assert main([*argv[:6], "--refresh-profile", *argv[6:]]) == 0
    out = json.loads(capsys.readouterr().out)
    assert calls == [1] and out["step"]["rates"] == "this CPU at 1 thread(s), measured again"
    assert (
        any("measured now" in n for n in out["notes"])
        and json.loads(path.read_text())["measured_at"] == "again"
    )


def test_knobs_in_todays_spellings_and_more_gpus_on_one_machine():
    from mrtpo.plan import plan_recipe
    from tests.plan.test_report import ROOT, args

    one = plan_recipe(str(ROOT / "recipes" / "sql_qwen2.5-coder-7b.yaml"), args(gpus=1))
    changes = [k.change for k in one.knobs]
    assert "--gpus 2 (one machine)" in changes and "--gpus 4 (one machine)" in changes
    assert not any("nodes" in c for c in changes)  # one GPU: more GPUs in the machine, not 4 nodes of 1
    eight = plan_recipe(str(ROOT / "recipes" / "sql_qwen2.5-coder-7b.yaml"), args(gpus=8))
    changes = [k.change for k in eight.knobs]
    assert "16 GPUs (--nodes 2 of 8)" in changes and "32 GPUs (--nodes 4 of 8)" in changes
    assert any(c.startswith("--replay.sharding lockstep") for c in changes)  # what mrtpo train reads today
    assert not any("method.replay_sharding" in c for c in changes)


def test_verl_runs_its_reference_model_with_a_kl_loss():
    from mrtpo.plan import plan_recipe
    from tests.plan.test_report import ROOT, args

    recipe = str(ROOT / "recipes" / "verl_sql_mrtpo.yaml")
    plain = plan_recipe(recipe, args())
    kl = plan_recipe(recipe, args(), ["actor_rollout_ref.actor.use_kl_loss=true"])
    assert plain.setup.beta == 0 and "reference" not in plain.step.phases
    assert kl.setup.beta == 0.001 and kl.step.phases["reference"] == kl.step.phases["rollout pass"]
    assert kl.memory.parts["reference"] == 2 * kl.setup.shape.params() // 8  # FSDP2: a bf16 shard


def test_a_model_reward_scorer_and_its_attribution_are_counted():
    """A 7B reward model beside the SQL recipe: its bf16 weights on every process in every phase; with p2t,
    one attribution call of it (batch 1, checkpointing, over the longest prompt and completion, 2,048
    tokens) in the replay phase: mrtpo.attribution's term, 0.72 GiB; none with credit reward."""
    from mrtpo.attribution import attribution_activation_bytes
    from mrtpo.plan import plan_recipe
    from mrtpo.plan.memory import GIB
    from mrtpo.plan.shapes import model_shape
    from tests.plan.test_report import ROOT, args

    recipe = str(ROOT / "recipes" / "sql_qwen2.5-coder-7b.yaml")
    rm = '[{"name": "rm", "model": "Qwen/Qwen2.5-7B-Instruct", "kind": "classifier"}]'
    plain = plan_recipe(recipe, args())
    reward = plan_recipe(recipe, args(), ["--task.options.model_rewards", rm])
    p2t = plan_recipe(recipe, args(), ["--task.options.model_rewards", rm, "--method.credit", "p2t"])
    shape = model_shape("Qwen/Qwen2.5-7B-Instruct")
    assert reward.memory.parts["scorers"] == p2t.memory.parts["scorers"] == 2 * shape.params()
    assert "scorers" not in plain.memory.parts and reward.memory.parts["attribution"] == 0
    want = attribution_activation_bytes(layers=shape.layers, hidden=shape.hidden, intermediate=shape.intermediate,
                                        tokens=2048, batch=1, checkpointing=True)  # fmt: skip
    assert p2t.memory.parts["attribution"] == want and round(want / GIB, 2) == 0.72
    for phase, v in plain.memory.phases.items():  # the scorer's weights in every phase (with its overhead)
        assert reward.memory.phases[phase] > v + 2 * shape.params()
    from mrtpo.plan.report import table

    (line,) = [x for x in table(p2t).splitlines() if x.strip().startswith("attribution")]
    assert "0.72" in line and "one attribution call of the largest scorer (replay)" in line  # printed whole
