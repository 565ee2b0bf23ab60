"""AdvancedIF: rubric judge prompts and parsing, and runs against a real local HTTP server that speaks the
OpenAI chat API (started by the test, answering as a scripted judge)."""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mrtpo.eval.advancedif import answer_verdict, judge_prompt, parse_judgement
from mrtpo.eval.benchmark import BENCHMARKS
from mrtpo.eval.judge import CachedJudge, JudgeError, OpenAIChatJudge, cache_key

# ---------------------------------------------------------------------------------------------------
# A scripted judge behind a real HTTP server


def scripted_answer(prompt: str) -> str:
    """The judge's JSON: rubric i passes when the single-quoted word it names appears in the reply."""
    reply = re.search(r"The assistant's reply to grade:\n=+\n(.*?)\n=+\n", prompt, re.S).group(1)
    rubrics = re.search(r"Rubric questions \(answer each one on its own\):\n(.*?)\n\n", prompt, re.S).group(1)
    checks = {}
    for line in rubrics.splitlines():
        num, text = line.split(". ", 1)
        word = re.search(r"'([^']+)'", text).group(1)
        checks[f"question_{num}"] = f"looked for {word}. " + ("YES" if word in reply else "NO")
    satisfied = "YES" if all(v.endswith("YES") for v in checks.values()) else "NO"
    return json.dumps({"rubrics_check": checks, "SATISFIED_ALL_REQUIREMENTS": satisfied})


class JudgeServer:
    """``/v1/chat/completions`` on 127.0.0.1; ``script`` is a list of status codes (or "slow") used by the
    next requests before it answers normally; every request is recorded."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.script: list = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                server.headers.append(dict(self.headers))
                action = server.script.pop(0) if server.script else 200
                if action == "slow":
                    time.sleep(1.0)
                    action = 200
                if self.path != "/v1/chat/completions":
                    action = 404
                if action != 200:
                    self.send_response(action)
                    if action == 429:
                        self.send_header("Retry-After", "0")
                    self.end_headers()
                    self.wfile.write(b'{"error": {"message": "scripted failure"}}')
                    return
                content = scripted_answer(body["messages"][-1]["content"])
                out = json.dumps(
                    {"choices": [{"message": {"role": "assistant", "content": content}}]}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = JudgeServer()
    yield s
    s.close()


# ---------------------------------------------------------------------------------------------------
# Data in the public release's format (JSON text inside the fields)


def _row(history, rubrics, task, response=None, **extra):
    row = {
        "conversation_history": json.dumps(history),
        "prompt_metadata": json.dumps({"rubrics": json.dumps(rubrics)}),
        "benchmark_name": task,
        **extra,
    }
    if response is not None:
        row["response"] = json.dumps([{"role": "assistant", "content": response}])
    return row


ROWS = [
    _row(
        [{"role": "user", "content": "Write a haiku about spring mentioning cherry and wind."}],
        ["Does it mention 'cherry'?", "Does it mention 'wind'?"],
        "if_complex_if_oss",
        response="cherry petals fall / wind carries them away / spring is here",
    ),
    _row(
        [
            {"role": "user", "content": "Give me 3 gift ideas."},
            {"role": "assistant", "content": "book, watch, headphones"},
            {"role": "user", "content": "Two more under $50, please."},
        ],
        ["Does it suggest a 'candle'?", "Does it suggest a 'mug'?", "Does it suggest a 'scarf'?"],
        "if_carried_context_oss",
        response="A candle and a scarf.",
    ),
    _row(
        [
            {"role": "system", "content": "Always answer like a pirate."},
            {"role": "user", "content": "How is the weather?"},
        ],
        ["Does it say 'arr'?"],
        "if_system_steerability_oss",
        response="arr, sunny skies today",
    ),
]
# hand-computed verdicts of the scripted judge (row 1 names a candle and a scarf, no mug)
EXPECTED = {"0": [True, True], "1": [True, False, True], "2": [True]}


def _args(tmp_path, data, judge_url, **kw):
    ns = argparse.Namespace(
        data=str(data),
        judge=judge_url,
        judge_model="scripted-judge",
        judge_api_key_env="MRTPO_JUDGE_API_KEY,OPENAI_API_KEY",
        judge_cache=str(tmp_path / "cache"),
        no_judge_cache=False,
        judge_max_tokens=None,
        judge_timeout=5.0,
        judge_retries=3,
        judge_workers=2,
        judge_temperature="0",
        judge_extra=None,
        task=None,
    )
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def run_eval(args, responses_path):
    """What ``mrtpo eval advancedif --responses FILE`` does: load, read responses, score, aggregate."""
    bench = BENCHMARKS.get("advancedif")(args)
    items = bench.load()
    responses = bench.read_responses(responses_path)
    verdicts = bench.score(items, responses)
    return bench, verdicts, bench.aggregate(verdicts)


# ---------------------------------------------------------------------------------------------------


def test_answer_verdict_and_parse_judgement():
    assert answer_verdict("The list has 3 items. YES") is True
    assert answer_verdict("No bullet points are used, as asked. YES.") is True  # the final word decides
    assert answer_verdict("NO - the intro is four sentences") is False
    assert answer_verdict("yes") is True
    assert answer_verdict("unclear") is None
    out = (
        "```json\n"
        + json.dumps(
            {
                "rubrics_check": {"question_1": "ok. YES", "question_2": "missing. NO"},
                "SATISFIED_ALL_REQUIREMENTS": "NO",
            }
        )
        + "\n```"
    )
    p = parse_judgement(out, 3)
    assert p["ok"] and p["rubrics"] == [True, False, False] and p["satisfied"] is False
    assert p["error"] == "no answer to question(s) [3]"
    bad = parse_judgement("I think it is fine.", 2)
    assert not bad["ok"] and bad["rubrics"] == [False, False] and bad["satisfied"] is False


def test_judge_prompt_names_rubrics_and_scope():
    msgs = [{"role": "system", "content": "Be a pirate."}, {"role": "user", "content": "Hi"}]
    p = judge_prompt(msgs, "arr", ["Q one?", "Q two?"], "if_system_steerability_oss")
    assert "The system prompt:" in p and "Be a pirate." in p and "1. Q one?\n2. Q two?" in p
    assert "against the instructions of the system prompt" in p
    q = judge_prompt(msgs, "arr", ["Q?"], "if_complex_if_oss")
    assert "The system prompt:" not in q and "[system]\nBe a pirate." in q


def test_end_to_end_with_retry_and_cache(tmp_path, server, monkeypatch):
    monkeypatch.setenv("MRTPO_JUDGE_API_KEY", "sk-test-123")
    data = _write_jsonl(tmp_path / "advancedif.jsonl", ROWS)
    server.script = [429]  # the first request is rate limited, then answered
    args = _args(tmp_path, data, server.url, judge_workers=1)
    _, verdicts, report = run_eval(args, data)  # the data file itself holds the responses
    assert len(server.requests) == 3 + 1  # three items, one retry
    assert {h.get("Authorization") for h in server.headers} == {"Bearer sk-test-123"}
    assert all(r["model"] == "scripted-judge" and r["temperature"] == 0.0 for r in server.requests)
    got = {v["id"]: [r["passed"] for r in v["rubrics"]] for v in verdicts}
    assert got == EXPECTED
    assert [v["passed"] for v in verdicts] == [True, False, True]
    assert report["n"] == 3 and report["pass_rate"] == pytest.approx(2 / 3)
    assert report["rubric_pass_rate"] == pytest.approx(5 / 6)
    assert report["by_task"]["if_carried_context_oss"]["rubric_pass_rate"] == pytest.approx(2 / 3)
    assert report["judge_failures"] == 0
    assert report["judge_cache"]["misses"] == 3 and report["judge_cache"]["hits"] == 0
    # a second run (a fresh benchmark object, same cache folder) sends no request at all
    before = len(server.requests)
    _, verdicts2, report2 = run_eval(_args(tmp_path, data, server.url, judge_workers=3), data)
    assert len(server.requests) == before
    assert report2["judge_cache"] == {"hits": 3, "misses": 0, "dir": str(tmp_path / "cache")}
    assert [v["rubrics"] for v in verdicts2] == [v["rubrics"] for v in verdicts]
    assert "Bearer" not in json.dumps([p.read_text() for p in (tmp_path / "cache").rglob("*.json")])


def test_responses_jsonl_and_task_filter(tmp_path, server):
    data = _write_jsonl(tmp_path / "d.jsonl", [{k: v for k, v in r.items() if k != "response"} for r in ROWS])
    resp = _write_jsonl(tmp_path / "r.jsonl", [{"id": "1", "response": "a candle, a mug"}])
    args = _args(
        tmp_path,
        data,
        server.url,
        task="if_carried_context_oss",
        no_judge_cache=True,
        judge_temperature="none",  # as reasoning models (o3-mini) need
        judge_extra='{"max_completion_tokens": 64}',
    )
    _, verdicts, report = run_eval(args, resp)
    assert [v["id"] for v in verdicts] == ["1"]
    assert [r["passed"] for r in verdicts[0]["rubrics"]] == [True, True, False]
    assert report["pass_rate"] == 0.0 and report["rubric_pass_rate"] == pytest.approx(2 / 3)
    assert len(server.requests) == 1
    assert "temperature" not in server.requests[0] and server.requests[0]["max_completion_tokens"] == 64


def test_backoff_is_exponential_and_capped(server):
    waits: list[float] = []
    server.script = [503, 502, 500]
    judge = OpenAIChatJudge(server.url, "m", max_retries=3, backoff=0.5, max_backoff=1.5, sleep=waits.append)
    prompt = judge_prompt([{"role": "user", "content": "x"}], "says 'hi'", ["Does it say 'hi'?"], "")
    out = judge.complete([{"role": "user", "content": prompt}])
    assert json.loads(out)["SATISFIED_ALL_REQUIREMENTS"] == "YES"
    assert waits == [0.5, 1.0, 1.5] and judge.requests == 4
    server.script = [503] * 3
    with pytest.raises(JudgeError, match="giving up after 2 attempts: HTTP 503"):
        OpenAIChatJudge(server.url, "m", max_retries=1, sleep=waits.append).complete(
            [{"role": "user", "content": prompt}]
        )


def test_timeout_is_retried_and_client_errors_are_not(server):
    prompt = judge_prompt([{"role": "user", "content": "x"}], "'a'", ["Is there 'a'?"], "")
    server.script = ["slow"]
    judge = OpenAIChatJudge(server.url, "m", timeout=0.3, max_retries=2, sleep=lambda s: None)
    assert "YES" in judge.complete([{"role": "user", "content": prompt}])
    assert judge.requests == 2
    server.script = [400]
    judge = OpenAIChatJudge(server.url, "m", max_retries=5, sleep=lambda s: None)
    with pytest.raises(JudgeError, match="HTTP 400"):
        judge.complete([{"role": "user", "content": prompt}])
    assert judge.requests == 1


def test_failed_judge_call_fails_the_item(tmp_path, server):
    data = _write_jsonl(tmp_path / "d.jsonl", ROWS[:1])
    server.script = [401]
    _, verdicts, report = run_eval(_args(tmp_path, data, server.url, no_judge_cache=True), data)
    assert verdicts[0]["judge_ok"] is False and "HTTP 401" in verdicts[0]["error"]
    assert report["pass_rate"] == 0.0 and report["judge_failures"] == 1


def test_cache_key_depends_on_model_and_messages(tmp_path):
    m = [{"role": "user", "content": "hi"}]
    assert cache_key("a", m) != cache_key("b", m)
    assert cache_key("a", m) != cache_key("a", [{"role": "user", "content": "hi!"}])

    class Counting:
        name = "counting"
        calls = 0

        def complete(self, messages):
            Counting.calls += 1
            return f"answer {len(messages)}"

    judge = CachedJudge(Counting(), tmp_path)
    assert judge.complete(m) == judge.complete(m) == "answer 1"
    assert Counting.calls == 1 and (judge.hits, judge.misses) == (1, 1)


def test_bad_rows_are_named(tmp_path, server):
    bad = dict(ROWS[0])
    bad["prompt_metadata"] = json.dumps({"rubric": "[]"})
    data = _write_jsonl(tmp_path / "bad.jsonl", [ROWS[1], bad])
    with pytest.raises(ValueError, match=r"bad.jsonl:2: prompt_metadata.rubrics must be a non-empty list"):
        BENCHMARKS.get("advancedif")(_args(tmp_path, data, server.url)).load()
    ends_with_assistant = _row(
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], ["q"], ""
    )
    data = _write_jsonl(tmp_path / "bad2.jsonl", [ends_with_assistant])
    with pytest.raises(ValueError, match=r"bad2.jsonl:1: conversation_history must end with a user message"):
        BENCHMARKS.get("advancedif")(_args(tmp_path, data, server.url)).load()
    twice = [{**ROWS[0], "id": "a"}, {**ROWS[1], "id": "a"}]  # the same id under two tasks
    data = _write_jsonl(tmp_path / "twice.jsonl", twice)
    only_second = _args(tmp_path, data, server.url, task="if_carried_context_oss")
    with pytest.raises(ValueError, match=r"twice.jsonl:2: duplicate id 'a' \(first at .*twice.jsonl:1\)"):
        BENCHMARKS.get("advancedif")(only_second).load()  # refused whichever task is kept
    with pytest.raises(ValueError, match="neither an http"):
        from mrtpo.eval.judge import make_judge

        make_judge(str(tmp_path / "no-such-model"))


def test_local_model_judge(tmp_path, tiny_model, tiny_tokenizer):
    """A local model folder as judge: its (random) output is cached and, unreadable, fails the rubrics."""
    from mrtpo.eval.judge import make_judge

    path = tmp_path / "judge-model"
    tiny_tokenizer.save_pretrained(path)
    tiny_model.save_pretrained(path)
    judge = make_judge(str(path), cache_dir=tmp_path / "cache", max_tokens=8)
    msgs = [{"role": "user", "content": judge_prompt([{"role": "user", "content": "a"}], "b", ["q?"], "")}]
    out = judge.complete(msgs)
    assert isinstance(out, str) and judge.complete(msgs) == out
    assert (judge.hits, judge.misses) == (1, 1)
    assert parse_judgement(out, 1)["ok"] is False
