"""mrtpo.io: JSON lines read back as written, errors naming file and line, a partial last line of a file
being written, appends."""

from __future__ import annotations

import json
import re

import pytest

from mrtpo import io


def test_write_then_read_round_trip(tmp_path):
    rows = [{"step": 1, "text": "naïve – 中文"}, {"step": 2, "nested": {"a": [1, 2.5, None]}}]
    path = io.write_jsonl(tmp_path / "sub" / "a.jsonl", rows)  # the folder is created
    raw = path.read_text(encoding="utf-8")
    assert raw == '{"step": 1, "text": "naïve – 中文"}\n{"step": 2, "nested": {"a": [1, 2.5, null]}}\n'
    assert io.read_jsonl(path) == rows
    assert list(io.iter_jsonl(path)) == [(f"{path}:1", rows[0]), (f"{path}:2", rows[1])]
    io.write_jsonl(path, rows[:1])  # write replaces
    assert io.read_jsonl(path) == rows[:1]


def test_append_adds_lines_and_default_writes_other_types(tmp_path):
    path = tmp_path / "m.jsonl"
    io.append_jsonl(path, [{"step": 1}])
    io.append_jsonl(path, [{"step": 2}, {"step": 3, "p": tmp_path}], default=str)
    assert io.read_jsonl(path) == [{"step": 1}, {"step": 2}, {"step": 3, "p": str(tmp_path)}]


def test_blank_lines_and_crlf_are_read(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"a": 1}\r\n\r\n   \n{"a": 2}')  # no newline after the last line: a whole value
    assert [w for w, _ in io.iter_jsonl(path)] == [f"{path}:1", f"{path}:4"]
    assert io.read_jsonl(path) == [{"a": 1}, {"a": 2}]


def test_errors_name_the_file_and_the_line(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"a": 1}\n\n{"a": \n{"a": 3}\n')
    with pytest.raises(
        ValueError, match=rf"^{re.escape(str(path))}:3: not JSON \(Expecting value, column 7\)$"
    ):
        io.read_jsonl(path)
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:2: expected a JSON object, got list$"):
        io.read_jsonl(path)
    assert io.read_jsonl(path, objects=False) == [{"a": 1}, [1, 2]]
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n")  # deeper than the parser goes
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:1: not JSON"):
        io.read_jsonl(path, objects=False)
    with pytest.raises(FileNotFoundError, match=r"^responses file '.*none.jsonl' does not exist$"):
        io.read_jsonl(tmp_path / "none.jsonl", what="responses file")
    with pytest.raises(ValueError, match=r"^rows.jsonl \(in memory\):2: not JSON"):
        io.parse_jsonl('{"a": 1}\nnope\n', "rows.jsonl (in memory)")


def test_partial_last_line_of_a_file_being_written(tmp_path):
    path = tmp_path / "metrics.jsonl"
    line = json.dumps({"step": 2, "reward": 0.25})
    path.write_text('{"step": 1}\n' + line[:10])  # the writer is in the middle of line 2
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}:2: not JSON"):
        io.read_jsonl(path)
    assert io.read_jsonl(path, partial_last_line=True) == [{"step": 1}]
    path.write_text('{"step": 1}\n' + line)  # complete but without its newline yet: read
    assert io.read_jsonl(path, partial_last_line=True) == [{"step": 1}, {"step": 2, "reward": 0.25}]
    path.write_text('{"step": 1\n{"step": 2}\n')  # a bad line that is not the last one is still an error
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}:1: not JSON"):
        io.read_jsonl(path, partial_last_line=True)
    path.write_text('{"step": 1}\n{"step": 2\n')  # a bad last line with its newline: finished, so an error
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}:2: not JSON"):
        io.read_jsonl(path, partial_last_line=True)


def test_a_resumed_run_drops_later_steps_and_a_cut_line(tmp_path):
    from mrtpo.integrations.trl.run_logging import append_jsonl, truncate_after

    path = tmp_path / "metrics.jsonl"
    append_jsonl(path, [{"step": s, "loss": float("nan") if s == 2 else 0.5} for s in (1, 2, 3)])
    with path.open("a") as f:
        f.write('{"step": 4, "lo')  # the interrupted run's last write
    truncate_after(path, 2)
    assert io.read_jsonl(path) == [{"step": 1, "loss": 0.5}, {"step": 2, "loss": None}]
