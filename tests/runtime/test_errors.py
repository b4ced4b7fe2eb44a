"""Error files: xrun's ``@record`` and torch's write the same schema; reading is tolerant."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from xrun.runtime.errors import (
    ERROR_FILE_ENV,
    NO_ERROR_FILE_MESSAGE,
    ProcessFailure,
    error_file_message,
    read_error_file,
    record,
    write_error_file,
)


def _raise_in_subprocess(tmp_path, decorator_import: str) -> dict:
    """Run a script whose @record-decorated main raises; return its error file."""
    err = tmp_path / "error.json"
    script = textwrap.dedent(
        f"""
        {decorator_import}

        @record
        def main():
            secret_local = 42
            raise ValueError("bad learning rate 7")

        main()
        """
    )
    main_py = tmp_path / "main.py"  # a file, so the traceback shows source lines
    main_py.write_text(script)
    proc = subprocess.run(
        [sys.executable, str(main_py)],
        env={**os.environ, ERROR_FILE_ENV: str(err)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr  # re-raised: the process still fails
    assert "ValueError: bad learning rate 7" in proc.stderr
    data = read_error_file(str(err))
    assert data is not None
    return data


def _shape(doc: object) -> object:
    """The document's key structure (values replaced by their type)."""
    if isinstance(doc, dict):
        return {k: _shape(v) for k, v in doc.items()}
    return type(doc).__name__


def test_xrun_record_writes_torchelastic_schema(tmp_path):
    data = _raise_in_subprocess(tmp_path, "from xrun.runtime.errors import record")
    msg = data["message"]
    assert msg["message"] == "ValueError: bad learning rate 7"
    assert "in main" in msg["extraInfo"]["py_callstack"]
    assert "raise ValueError" in msg["extraInfo"]["py_callstack"]
    assert int(msg["extraInfo"]["timestamp"]) > 1_600_000_000
    assert oct(os.stat(tmp_path / "error.json").st_mode & 0o777) == "0o600"


@pytest.mark.timeout(120)
def test_torch_record_file_reads_the_same(tmp_path):
    pytest.importorskip("torch")
    ours = _raise_in_subprocess(tmp_path, "from xrun.runtime.errors import record")
    theirs = _raise_in_subprocess(
        tmp_path, "from torch.distributed.elastic.multiprocessing.errors import record"
    )
    assert _shape(ours) == _shape(theirs)
    text, stamp = error_file_message(theirs)
    assert text == "ValueError: bad learning rate 7"
    assert stamp is not None and stamp > 1_600_000_000
    failure = ProcessFailure.from_exit(0, 123, 1, str(tmp_path / "error.json"), 5.0)
    assert failure.message == "ValueError: bad learning rate 7"
    assert failure.timestamp == stamp  # the error's time, not the exit's
    assert "raise ValueError" in failure.error_file_data["message"]["extraInfo"]["py_callstack"]


def test_record_in_process_writes_and_reraises(tmp_path, monkeypatch):
    path = tmp_path / "e.json"
    monkeypatch.setenv(ERROR_FILE_ENV, str(path))

    @record
    def fails(x: int) -> int:
        raise KeyError(x)

    with pytest.raises(KeyError):
        fails(3)
    assert read_error_file(str(path))["message"]["message"] == "KeyError: 3"


def test_record_passes_return_and_exit_codes(tmp_path, monkeypatch):
    path = tmp_path / "e.json"
    monkeypatch.setenv(ERROR_FILE_ENV, str(path))
    assert record(lambda: 5)() == 5
    assert record(lambda: sys.exit(0))() is None  # runpy-style mains end with exit(0)

    def exit_two() -> None:
        sys.exit(2)

    with pytest.raises(SystemExit):
        record(exit_two)()
    assert not path.exists()  # an exit code is not an exception worth a traceback


def test_write_then_read_round_trip(tmp_path):
    path = str(tmp_path / "e.json")
    try:
        raise RuntimeError("disk on fire")
    except RuntimeError as exc:
        write_error_file(path, exc)
    text, stamp = error_file_message(read_error_file(path))
    assert text == "RuntimeError: disk on fire"
    assert isinstance(stamp, int)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


@pytest.mark.parametrize("content", ["", "{not json", "[1, 2]", "\x00\xff"])
def test_read_error_file_tolerates_garbage(tmp_path, content):
    path = tmp_path / "e.json"
    path.write_text(content, errors="surrogateescape")
    assert read_error_file(str(path)) is None
    assert read_error_file(str(tmp_path / "missing.json")) is None
    assert read_error_file(None) is None


def test_cpp_style_error_file(tmp_path):
    # torchelastic's C++ handler writes a flat message with a top-level timestamp.
    path = tmp_path / "e.json"
    path.write_text(json.dumps({"message": "c10::Error: CUDA OOM", "timestamp": 1700000000}))
    f = ProcessFailure.from_exit(2, 99, -6, str(path), 1800000000.5)
    assert (f.message, f.timestamp, f.signal_name()) == (
        "c10::Error: CUDA OOM",
        1700000000,
        "SIGABRT",
    )


def test_failure_messages_without_error_file(tmp_path):
    killed = ProcessFailure.from_exit(1, 4242, -9, str(tmp_path / "none.json"), 1700000000.9)
    assert killed.message == "Signal 9 (SIGKILL) received by PID 4242"
    assert killed.signal_name() == "SIGKILL"
    # torch's values where a worker left no error file
    assert killed.error_file == "<N/A>" and killed.error_file_data == {"message": "<NONE>"}
    assert ProcessFailure.from_exit(0, 7, 3, None, 1.0).error_file_data["errorTraits"] == {
        "category": "system_terminated_error",
        "retryability": "False",
    }
    assert killed.timestamp == 1700000000
    exited = ProcessFailure.from_exit(0, 7, 3, None, 1.0)
    assert exited.message == NO_ERROR_FILE_MESSAGE
    assert exited.signal_name() == "<N/A>"


def test_malformed_error_file_raises_in_the_constructor_but_not_for_the_agent(tmp_path):
    path = tmp_path / "e.json"
    path.write_text(json.dumps({"unknown_key": "unknown_value"}))
    with pytest.raises(ValueError, match="no 'message'"):
        ProcessFailure(local_rank=0, pid=997, exitcode=1, error_file=str(path))  # as torch
    f = ProcessFailure.from_exit(0, 997, 1, str(path), 5.0)  # the agent keeps the failure
    assert f.exitcode == 1 and f.error_file == "<N/A>"
    assert "is malformed" in f.message and str(path) in f.message
