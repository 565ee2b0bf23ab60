"""A reward model behind HTTP (mrtpo.tasks.remote_reward) against a reward server this test starts on
127.0.0.1: the request it sends, batching, retries, timeouts, the failing-verifier policy, and training
through TRL with credit reward."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mrtpo.prompt import Segment
from mrtpo.tasks import Example
from mrtpo.tasks.faults import score_batch
from mrtpo.tasks.model_reward import WithModelRewards, parse_model_rewards
from mrtpo.tasks.remote_reward import RemoteReward


def share_of_the(response: str) -> float:
    """The server's score: the share of the response's words that are "the" (0 for no word)."""
    words = response.split()
    return sum(w == "the" for w in words) / len(words) if words else 0.0


class RewardServer:
    """A reward server on 127.0.0.1 (a thread): scores each response with :func:`share_of_the`. ``script``
    holds what the next requests get first: an HTTP status, "slow" (answers after 1 s) or "short" (one
    score too few); every request's JSON body is kept. At most ``limit`` requests are answered."""

    def __init__(self, limit: int = 400):
        self.requests: list[dict] = []
        self.script: list = []
        self.limit = limit
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(body)
                step = owner.script.pop(0) if owner.script else None
                if len(owner.requests) > owner.limit:
                    step = 503
                if isinstance(step, int):
                    self.send_response(step)
                    self.end_headers()
                    self.wfile.write(b"scripted failure")
                    return
                if step == "slow":
                    time.sleep(1.0)
                rewards = [share_of_the(r) for r in body["responses"]]
                if step == "short":
                    rewards = rewards[:-1]
                data = json.dumps({"rewards": rewards}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/score"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = RewardServer()
    yield s
    s.close()


def _ex(i=0, text="say the word"):
    return Example(f"e{i}", [Segment(text)])


RESPONSES = ["the cat", "a dog", "the the end", "", "nothing here at all"]


def test_batches_and_the_request(server):
    rm = RemoteReward("rm", server.url, rubric="use the word the", batch_size=2)
    got = rm([*RESPONSES], [_ex(i) for i in range(5)])
    assert got == [0.5, 0.0, pytest.approx(2 / 3), 0.0, 0.0]
    assert [len(r["responses"]) for r in server.requests] == [2, 2, 1] and rm.requests == 3
    first = server.requests[0]
    assert first["prompts"] == ["say the word", "say the word"]
    assert first["query"] == ["say the wordthe cat", "say the worda dog"]
    assert first["labels"] == ["use the word the"] * 2
    assert rm.verdict(_ex(), "the x").value == 0.5


def test_retries_and_timeouts_then_success(server):
    server.script = [503, "slow"]
    rm = RemoteReward("rm", server.url, timeout=0.3, max_retries=2, backoff=0.0)
    assert rm.verdict(_ex(), "the").value == 1.0
    assert rm.requests == 3  # a 503, a timeout, then the answer


def test_failed_requests_follow_the_failing_verifier_policy(server):
    """A client error is not retried and fails the verdicts: the batch is redone one by one, each failing
    response is a fault naming the HTTP status; an answer with a score too few fails the batch, and the
    row-by-row verdicts then succeed."""
    rm = RemoteReward("rm", server.url, batch_size=4, max_retries=1, backoff=0.0)
    server.script = [400] * 4
    values, faults = score_batch([[rm]] * 3, [_ex(i) for i in range(3)], RESPONSES[:3], ["rm"])
    assert [f.row for f in faults] == [0, 1, 2] and all("HTTP 400" in f.cause for f in faults)
    assert values.tolist() == [[0.0], [0.0], [0.0]]  # the minimum, as policy 'min' trains on
    assert len(server.requests) == 3 + 1  # the batch, then one per response (a 400 is not retried)
    server.script = ["short"]
    values, faults = score_batch([[rm]] * 3, [_ex(i) for i in range(3)], RESPONSES[:3], ["rm"])
    assert faults == [] and values[:, 0].tolist() == pytest.approx([0.5, 0.0, 2 / 3])


def test_the_task_option_builds_remote_rewards(server):
    (rm,) = parse_model_rewards([{"name": "srv", "url": server.url, "batch_size": 3, "rubric": "r"}])
    assert isinstance(rm, RemoteReward) and rm.batch_size == 3 and not rm.differentiable
    for entry, why in (
        ({"name": "srv", "url": "ftp://x"}, "url='ftp://x' must start with http:// or https://"),
        ({"name": "srv", "url": server.url, "kind": "judge"}, "unknown field 'kind' of a remote reward"),
        ({"name": "srv", "url": server.url, "timeout": -1}, "timeout=-1 must be a finite number >= 0"),
    ):
        with pytest.raises(ValueError) as e:
            parse_model_rewards([entry])
        assert str(e.value).startswith("task.options.model_rewards[0]") and why in str(e.value), str(e.value)


@pytest.mark.slow
def test_a_remote_reward_trains_through_trl(tmp_path, server):
    """The TRL test task's two rules and the reward server's score; credit reward (no gradient needed):
    each batch's server column is the server's score of its responses, the request count is bounded."""
    from tests.integrations.trl.test_trainer import TinyTask, make_trainer, tiny_tokenizer

    task = WithModelRewards(TinyTask(), [{"name": "srv", "url": server.url, "rubric": "say the"}])
    tr = make_trainer(tmp_path / "run", task=task, tok=tiny_tokenizer(), credit="reward")
    tr.train()
    k = task.reward_names.index("srv")
    assert len(tr.batches) == 2
    for b in tr.batches:
        rows = slice(*b["process_rows"])
        want = [share_of_the(t) for t in b["texts"]]
        assert b["rewards"][rows, k].tolist() == pytest.approx(want, abs=1e-6)
    assert 0 < len(server.requests) <= 2 * len(tr.batches)  # one batched request per scoring call
