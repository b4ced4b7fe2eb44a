"""The error API as torch 2.13 defines it: ``ProcessFailure``, ``ChildFailedError``,
``@record`` and ``ErrorHandler``. Runs against xrun, or torch (``XRUN_COMPAT_TARGET=torch``)."""

from __future__ import annotations

import json
import os
import signal
from unittest import mock

import pytest

from tests.compat.shim import ChildFailedError, ErrorHandler, ProcessFailure, record

NO_FILE = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"


def _recorded(path: str, exc: Exception) -> None:
    with mock.patch.dict(os.environ, {"TORCHELASTIC_ERROR_FILE": path}):
        ErrorHandler().record_exception(exc)


def test_failure_without_error_file(tmp_path):
    pf = ProcessFailure(local_rank=1, pid=42, exitcode=138, error_file=str(tmp_path / "none"))
    assert (pf.error_file, pf.error_file_data["message"], pf.message) == (
        "<N/A>",
        "<NONE>",
        NO_FILE,
    )
    assert pf.error_file_data["errorTraits"]["category"] == "system_terminated_error"
    assert pf.signal_name() == "<N/A>"
    killed = ProcessFailure(local_rank=0, pid=42, exitcode=-signal.SIGKILL, error_file="")
    assert killed.message == "Signal 9 (SIGKILL) received by PID 42"
    assert killed.signal_name() == "SIGKILL"


def test_failure_reads_both_error_file_shapes(tmp_path):
    nested = str(tmp_path / "nested.json")
    _recorded(nested, KeyError("lr"))
    pf = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=nested)
    assert pf.error_file == nested
    assert pf.error_file_data["message"]["message"] == "KeyError: 'lr'"
    assert str(pf.timestamp) == pf.error_file_data["message"]["extraInfo"]["timestamp"]
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"message": "c10::Error: OOM", "timestamp": "17"}))
    pf = ProcessFailure(local_rank=0, pid=1, exitcode=-6, error_file=str(flat))
    assert (pf.message, pf.timestamp, pf.signal_name()) == ("c10::Error: OOM", 17, "SIGABRT")


@pytest.mark.parametrize("content", ['{"unknown_key": 1}', "{not json"])
def test_malformed_error_file_raises(tmp_path, content):
    path = tmp_path / "e.json"
    path.write_text(content)
    with pytest.raises(Exception):  # noqa: B017 - torch raises KeyError or a JSON error here
        ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(path))


def test_child_failed_error_first_failure_and_summary(tmp_path):
    first = str(tmp_path / "first.json")
    (tmp_path / "second.json").write_text(
        json.dumps({"message": "later", "timestamp": 2_000_000_000})
    )
    early = tmp_path / "early.json"
    early.write_text(json.dumps({"message": "earliest", "timestamp": 1_000_000_000}))
    _recorded(first, RuntimeError("boom"))
    failures = {
        3: ProcessFailure(
            local_rank=1, pid=7, exitcode=1, error_file=str(tmp_path / "second.json")
        ),
        5: ProcessFailure(local_rank=0, pid=8, exitcode=1, error_file=str(early)),
        6: ProcessFailure(local_rank=2, pid=9, exitcode=-signal.SIGSEGV, error_file=""),
    }
    ex = ChildFailedError("train.py", failures)
    rank, failure = ex.get_first_failure()
    assert (rank, failure.message) == (5, "earliest")
    text = str(ex)
    assert "train.py FAILED" in text and "Root Cause (first observed failure):" in text
    assert "rank      : 5 (local_rank: 0)" in text
    assert "(SIGSEGV)" in text and f"exitcode  : {-signal.SIGSEGV}" in text
    assert "error_file: <N/A>" in text


def test_record_writes_the_exception_and_reraises(tmp_path):
    path = tmp_path / "error.json"

    @record
    def main() -> None:
        raise ValueError("bad lr")

    with mock.patch.dict(os.environ, {"TORCHELASTIC_ERROR_FILE": str(path)}):
        with pytest.raises(ValueError):
            main()
    doc = json.loads(path.read_text())
    assert doc["message"]["message"] == "ValueError: bad lr"
    assert "raise ValueError" in doc["message"]["extraInfo"]["py_callstack"]


def test_record_copies_a_child_failure_error_file_with_its_exit_code(tmp_path):
    child = str(tmp_path / "child.json")
    own = tmp_path / "own.json"
    _recorded(child, RuntimeError("in the worker"))

    @record
    def launcher() -> None:
        pf = ProcessFailure(local_rank=0, pid=11, exitcode=7, error_file=child)
        raise ChildFailedError("trainer", {0: pf})

    with mock.patch.dict(os.environ, {"TORCHELASTIC_ERROR_FILE": str(own)}):
        with pytest.raises(ChildFailedError):
            launcher()
    expect = json.loads(open(child).read())
    expect["message"]["errorCode"] = 7
    assert json.loads(own.read_text()) == expect


def test_record_writes_nothing_for_a_child_failure_without_error_file(tmp_path):
    own = tmp_path / "own.json"

    @record
    def launcher() -> None:
        pf = ProcessFailure(local_rank=0, pid=11, exitcode=7, error_file="")
        raise ChildFailedError("trainer", {0: pf})

    with mock.patch.dict(os.environ, {"TORCHELASTIC_ERROR_FILE": str(own)}):
        with pytest.raises(ChildFailedError):
            launcher()
    assert not own.exists()  # no file of its own for the agent's failure


def test_record_lets_exit_codes_through(tmp_path):
    path = tmp_path / "error.json"

    @record
    def ends(code: int) -> None:
        raise SystemExit(code)

    with mock.patch.dict(os.environ, {"TORCHELASTIC_ERROR_FILE": str(path)}):
        assert ends(0) is None
        with pytest.raises(SystemExit):
            ends(3)
    assert not path.exists()
