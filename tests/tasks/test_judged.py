"""JudgeVerifier: a reward from a model judge, with the evaluation judge's retries and backoff; a judge
that fails for good, or answers without a score, is a failed verdict (mrtpo.tasks.faults)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mrtpo.tasks import faults as F
from mrtpo.tasks.base import Example
from mrtpo.tasks.judged import JudgeVerifier, last_number


class Server:
    """``/v1/chat/completions``: the next requests answer with the statuses of ``script``, then 200 with
    ``answer``."""

    def __init__(self) -> None:
        self.script: list[int] = []
        self.answer = "The response is polite. Score: 0.75"
        self.bodies: list[dict] = []
        srv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                srv.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                status = srv.script.pop(0) if srv.script else 200
                body = (
                    {"choices": [{"message": {"content": srv.answer}}]}
                    if status == 200
                    else {"error": {"message": "busy"}}
                )
                out = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def _messages(example, response):
    return [{"role": "user", "content": f"Rate the politeness of: {response}\nEnd with 'Score: <0..1>'."}]


def test_last_number():
    assert last_number("Score: 0.8") == 0.8
    assert last_number("3 points of 10, final 7e-1") == 0.7
    assert last_number("no score") is None


def test_judge_verifier_retries_with_backoff_then_scores(server, tmp_path):
    waits: list[float] = []
    v = JudgeVerifier.from_spec(
        "polite",
        server.url,
        _messages,
        model="m",
        use_cache=False,
        judge_options={"max_retries": 3, "backoff": 0.5, "sleep": waits.append},
    )
    server.script = [503, 429]
    ex = Example("e1", [])
    assert F.safe_verdict(v, ex, "thank you") == (0.75, None)
    assert waits == [0.5, 1.0] and v.judge.requests == 3  # backoff * 2**attempt after each failure
    assert server.bodies[-1]["messages"][0]["content"].startswith("Rate the politeness of: thank you")


def test_a_judge_that_fails_for_good_or_answers_without_a_score_is_a_failed_verdict(server):
    v = JudgeVerifier.from_spec(
        "polite",
        server.url,
        _messages,
        model="m",
        use_cache=False,
        judge_options={"max_retries": 1, "sleep": lambda s: None},
    )
    ex = Example("e2", [])
    server.script = [500, 500]
    value, cause = F.safe_verdict(v, ex, "x")
    assert value is None and cause.startswith("raised JudgeError: giving up after 2 attempts: HTTP 500 from ")
    server.answer = "I cannot decide."
    assert F.safe_verdict(v, ex, "x") == (
        None,
        "raised JudgeError: the judge's answer holds no score: 'I cannot decide.'",
    )
    server.answer = "Score: 7"  # outside the bounds [0, 1]
    assert F.safe_verdict(v, ex, "x") == (None, "returned 7, outside its bounds [0, 1]")
