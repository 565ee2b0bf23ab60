"""Text-to-SQL prompt segments, response parsing and the three verifiers on the shipped data."""

from __future__ import annotations

import json

import pytest

from mrtpo.tasks import load_task
from mrtpo.tasks.base import Example
from mrtpo.tasks.sql import FORMAT_INSTRUCTION, SqlTask, parse_response
from mrtpo.tasks.sql.verify import QueryRunner, SqlExecutableVerifier, SqlExecutionVerifier


def answer(sql: str, think: str = "plan") -> str:
    return f"<think>{think}</think><answer>```sql\n{sql}\n```</answer>"


@pytest.fixture(scope="module")
def task():
    t = SqlTask(workers=2, timeout=2.0)
    yield t
    t.close()


@pytest.fixture(scope="module")
def dev(task):
    return task.load(split="dev")


def _find(examples, template_sql_part):
    return next(ex for ex in examples if template_sql_part in ex.meta["gold_sql"])


# -- parsing -------------------------------------------------------------------------------------


def test_parse_valid_response_spans():
    r = "<think>count</think><answer>```sql\nSELECT 1\n```</answer>"
    p = parse_response(r)
    assert p.format_ok and p.format_reason == ""
    assert p.sql == "SELECT 1" and p.sql_span == (35, 43)
    # <think> [0,7), </think> [12,20), <answer> [20,28), ```sql\n [28,35), ``` [44,47), </answer> [47,56)
    assert p.tag_spans == [(0, 7), (12, 20), (20, 28), (28, 35), (44, 47), (47, 56)]
    assert [r[a:b] for a, b in p.tag_spans] == [
        "<think>",
        "</think>",
        "<answer>",
        "```sql\n",
        "```",
        "</answer>",
    ]


@pytest.mark.parametrize(
    ("response", "reason", "sql"),
    [
        ("<answer>```sql\nSELECT 1\n```</answer>", "expected one <think>, found 0", "SELECT 1"),
        (
            "<think>a</think><think>b</think><answer>```sql\nSELECT 1\n```</answer>",
            "one <think>, found 2",
            "SELECT 1",
        ),
        ("<answer>```sql\nSELECT 1\n```</answer><think>a</think>", "tags out of order", "SELECT 1"),
        ("Sure! <think>a</think><answer>```sql\nSELECT 1\n```</answer>", "text before <think>", "SELECT 1"),
        (
            "<think>a</think> so <answer>```sql\nSELECT 1\n```</answer>",
            "between </think> and <answer>",
            "SELECT 1",
        ),
        ("<think>a</think><answer>```sql\nSELECT 1\n```</answer> done", "text after </answer>", "SELECT 1"),
        ("<think>a</think><answer>SELECT 1</answer>", "found 0 code fences", "SELECT 1"),
        ("<think>a</think><answer>```\nSELECT 1\n```</answer>", "exactly one ```sql code block", "SELECT 1"),
        (
            "<think>a</think><answer>```sql\nSELECT 1\n``` ```sql\nSELECT 2\n```</answer>",
            "found 4 code fences",
            "SELECT 1",
        ),
        ("<think>a</think><answer>```sql\n  \n```</answer>", "the sql code block is empty", None),
        ("<think>a</think><answer>```sql\nSELECT 1\n```", "expected one </answer>, found 0", "SELECT 1"),
        ("no tags at all", "expected one <think>, found 0", None),
        ("", "expected one <think>, found 0", None),
        ("<think>x</think>\n```sql\nSELECT 2\n```", "expected one <answer>, found 0", "SELECT 2"),
    ],
)
def test_parse_format_failures_and_lenient_sql(response, reason, sql):
    p = parse_response(response)
    assert not p.format_ok and reason in p.format_reason
    assert p.sql == sql
    if sql is not None:
        assert response[p.sql_span[0] : p.sql_span[1]] == sql
    assert parse_response(response, extraction="strict").sql is None


def test_parse_whitespace_and_case_are_tolerated():
    r = "\n<think>\nx\n</think>\n<answer>\n```SQL\nSELECT 2\n```\n</answer>\n"
    p = parse_response(r)
    assert p.format_ok and p.sql == "SELECT 2"
    assert parse_response(r, extraction="strict").sql == "SELECT 2"
    with pytest.raises(ValueError, match="extraction must be"):
        parse_response(r, extraction="loose")


# -- segments and information --------------------------------------------------------------------


def test_segments_are_tagged_by_reward(dev, task):
    ex = dev[0]
    tagged = {name: [s for s in ex.segments if name in s.rewards] for name in task.reward_names}
    assert all(len(v) == 1 for v in tagged.values())  # exactly one segment per reward
    assert all(len(s.rewards) <= 1 for s in ex.segments)  # no segment serves two rewards
    assert tagged["format"][0].text == FORMAT_INSTRUCTION and not tagged["format"][0].privileged
    assert tagged["executable"][0].text.startswith("Database schema:\n```sql\nCREATE TABLE airports")
    assert tagged["execution"][0].privileged and ex.meta["gold_sql"] in tagged["execution"][0].text
    question = [s for s in ex.segments if s.text.startswith("Question: ")]
    assert len(question) == 1 and not question[0].rewards

    fmt, exe, run = task.verifiers(ex)
    assert [v.name for v in (fmt, exe, run)] == task.reward_names
    assert fmt.information(ex) == FORMAT_INSTRUCTION
    assert exe.information(ex) == tagged["executable"][0].text
    assert run.information(ex) == tagged["execution"][0].text


def test_reference_only_in_replay_and_leave_one_out(dev):
    ex = dev[0]
    gold = ex.meta["gold_sql"]
    rollout = ex.messages()[-1]["content"]
    full = ex.messages(privileged=True)[-1]["content"]
    assert gold not in rollout and gold in full
    assert full.startswith(rollout)  # the privileged block comes after the task text
    no_schema = ex.messages(privileged=True, drop=frozenset({"executable"}))[-1]["content"]
    assert "CREATE TABLE" not in no_schema and gold in no_schema and FORMAT_INSTRUCTION in no_schema
    no_format = ex.messages(privileged=True, drop=frozenset({"format"}))[-1]["content"]
    assert FORMAT_INSTRUCTION not in no_format and "CREATE TABLE" in no_format and gold in no_format
    no_ref = ex.messages(privileged=True, drop=frozenset({"execution"}))[-1]["content"]
    assert no_ref == rollout


def test_example_round_trips_through_json(dev, task):
    ex = dev[3]
    back = Example.from_dict(json.loads(json.dumps(ex.to_dict())))
    assert back.messages(privileged=True) == ex.messages(privileged=True)
    assert back.meta == ex.meta
    assert task.score([back], [answer(back.meta["gold_sql"])]) == [[1.0, 1.0, 1.0]]


# -- verifiers -----------------------------------------------------------------------------------


def test_rewards_of_typical_responses(dev, task):
    ex = _find(dev, "SELECT count(*) FROM flights AS T1 JOIN airports")
    gold = ex.meta["gold_sql"]
    responses = [
        answer(gold),  # right
        answer("SELECT count(*) FROM flights"),  # runs, wrong count (the join filters by one airport)
        answer("SELECT count(*) FROM flight"),  # no such table
        f"<answer>```sql\n{gold}\n```</answer>",  # right query, no <think>
        "<think>hmm</think><answer>I do not know</answer>",  # no SQL that runs
        "",
    ]
    rewards = task.score([ex] * len(responses), responses)
    assert rewards == [
        [1.0, 1.0, 1.0],
        [1.0, 1.0, 0.0],
        [1.0, 0.0, 0.0],
        [0.0, 1.0, 1.0],
        [0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0],
    ]
    _, exe, run = task.verifiers(ex)
    assert "no such table: flight" in exe.verdict(ex, responses[2]).reason
    assert "result differs" in run.verdict(ex, responses[1]).reason
    assert exe.verdict(ex, responses[5]).reason == "no SQL found in the response"


def test_execution_uses_spider_semantics_with_column_permutation_and_order(dev, task):
    ex = _find(dev, "ORDER BY")
    gold = ex.meta["gold_sql"]
    _, _, run = task.verifiers(ex)
    assert run.score(ex, answer(gold)) == 1.0
    flipped = gold.replace(" DESC", " ASC") if " DESC" in gold else gold.replace(" ASC", " DESC")
    assert flipped != gold and run.score(ex, answer(flipped)) == 0.0  # lists: order matters
    pairs = _find(dev, "SELECT T1.flight_number, T2.name FROM")
    swapped = pairs.meta["gold_sql"].replace("T1.flight_number, T2.name", "T2.name, T1.flight_number")
    assert run.score(pairs, answer(swapped)) == 1.0  # columns permuted


def test_bird_semantics_from_meta(dev, task):
    ex = _find(dev, "SELECT DISTINCT")
    col = ex.meta["gold_sql"].split("SELECT DISTINCT ")[1].split(" ")[0]
    table = ex.meta["gold_sql"].split(" FROM ")[1].strip()
    dup = answer(f"SELECT {col} FROM {table}")  # same set of values, with duplicates
    _, _, run = task.verifiers(ex)
    assert run.score(ex, dup) == 0.0  # Spider: multisets differ
    bird = Example(ex.id, ex.segments, {**ex.meta, "match": "bird"})
    assert run.score(bird, dup) == 1.0  # BIRD: sets agree


def test_checked_spans(dev, task):
    ex = dev[0]
    r = answer(ex.meta["gold_sql"], think="count the rows")
    fmt, exe, run = task.verifiers(ex)
    tags = [r[a:b] for a, b in fmt.checked_spans(ex, r)]
    assert tags == ["<think>", "</think>", "<answer>", "```sql\n", "```", "</answer>"]
    (span,) = exe.checked_spans(ex, r)
    assert r[span[0] : span[1]] == ex.meta["gold_sql"]
    assert run.checked_spans(ex, r) == [span]
    assert exe.checked_spans(ex, "no sql here") == []


class CountingPool:
    """Delegates to a real pool and records every job it runs."""

    def __init__(self, pool):
        self.pool, self.jobs = pool, []

    def map(self, jobs, **kw):
        jobs = list(jobs)
        self.jobs.extend(jobs)
        return self.pool.map(jobs, **kw)


def test_gold_and_predicted_results_are_cached(dev, task):
    counting = CountingPool(task.runner.pool)
    runner = QueryRunner(counting, timeout=2.0)
    exe, run = SqlExecutableVerifier(runner), SqlExecutionVerifier(runner)
    ex = dev[5]
    responses = [answer(ex.meta["gold_sql"]), answer("SELECT 1"), answer(ex.meta["gold_sql"])]
    exe([*responses], [ex] * 3)
    run([*responses], [ex] * 3)
    run([*responses], [ex] * 3)
    db = ex.meta["db_path"]
    # the gold query ran once (gold cache); each distinct predicted query once (shared LRU):
    # gold SQL as a prediction + "SELECT 1" = 2 predicted jobs + 1 gold job
    assert sorted(counting.jobs) == sorted(
        [(db, ex.meta["gold_sql"]), (db, "SELECT 1"), (db, ex.meta["gold_sql"])]
    )
    no_cache = QueryRunner(counting, timeout=2.0, cache_size=0)
    counting.jobs.clear()
    SqlExecutableVerifier(no_cache)(responses, [ex] * 3)
    assert len(counting.jobs) == 2  # a batch still de-duplicates its own queries


def test_verifiers_never_raise_on_model_output(dev, task):
    ex = dev[1]
    weird = [
        "<think>" * 50,
        "```sql\n" * 20,
        "<answer>```sql\nSELECT 1; DROP TABLE airports\n```</answer>",
        "<answer>```sql\nATTACH 'x' AS y\n```</answer>",
        "<answer>```sql\nWITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r) SELECT count(*) FROM r\n```",
        "\x00\x01 binary-ish \ud7ff",
        "x" * 200_000,
    ]
    task.runner.timeout = 0.3
    try:
        rewards = task.score([ex] * len(weird), weird)
    finally:
        task.runner.timeout = 2.0
    assert all(v in (0.0, 1.0) for row in rewards for v in row)
    assert all(row[2] == 0.0 for row in rewards)


def test_comment_heavy_sql_is_scored_quickly(dev, task):
    # SELECT 1 followed by 20,000 empty commented statements: the static check was quadratic (> 14 s)
    import time

    response = "<think>x</think><answer>```sql\nSELECT 1" + ";--\n" * 20_000 + "\n```</answer>"
    t0 = time.perf_counter()
    fmt, executable, execution = task.score([dev[1]], [response])[0]
    assert (fmt, executable, execution) == (1.0, 1.0, 0.0)
    assert time.perf_counter() - t0 < 5.0  # ~0.1 s; the bound is only a hang guard under CI load


def test_load_task_by_name():
    t = load_task("sql", timeout=1.0)
    try:
        assert isinstance(t, SqlTask) and t.reward_names == ["format", "executable", "execution"]
        assert [v.bounds for v in t.verifiers(t.load(split="dev", limit=1)[0])] == [(0.0, 1.0)] * 3
    finally:
        t.close()
    with pytest.raises(ValueError, match=r"SqlTask\.match must be"):
        SqlTask(match="sets")
