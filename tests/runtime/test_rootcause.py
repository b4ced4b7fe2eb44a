"""Reading a root cause out of a stream and the kernel's counters (runtime/errors/rootcause.py,
deaths.py), piece by piece; the agent's use of them is tests/runtime/agent/test_rootcause.py."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from xrun.runtime.errors import ProcessFailure
from xrun.runtime.errors.deaths import OomCounter, OomRise, signal_cause
from xrun.runtime.errors.rootcause import describe, last_traceback, parse_traceback

TB = """\
step 1
Traceback (most recent call last):
  File "/job/train.py", line 40, in <module>
    main()
  File "/job/model.py", line 5, in forward
    raise ValueError("bad shape in batch 7")
ValueError: bad shape in batch 7
"""


def test_the_last_traceback_and_its_innermost_frame() -> None:
    tb = parse_traceback("Traceback (most recent call last):\nOSError: old\n" + TB)
    assert tb is not None
    assert tb.exception == "ValueError: bad shape in batch 7" and tb.where == "model.py:5"
    assert tb.text.startswith("Traceback") and "OSError" not in tb.text


def test_no_traceback_and_a_cut_one() -> None:
    assert parse_traceback("just output\nno error here\n") is None
    # killed while printing: the header and frames, no exception line yet
    assert parse_traceback('Traceback (most recent call last):\n  File "a.py", line 1\n') is None


def test_syntax_error_carets_are_not_the_exception_line() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "/job/bad.py", line 3\n'
        "    x = (\n"
        "        ^\n"
        "SyntaxError: '(' was never closed\n"
    )
    tb = parse_traceback(text)
    assert tb is not None and tb.exception == "SyntaxError: '(' was never closed"
    assert tb.where == "bad.py:3"


def test_only_the_tail_of_a_huge_log_is_read(tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    log.write_text("x" * 5_000_000 + "\n" + TB)
    tb = last_traceback(str(log))
    assert tb is not None and tb.where == "model.py:5"


def test_a_traceback_before_a_non_1_exit_is_not_the_cause(tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    log.write_text(TB + "retrying failed, giving up\n")
    f = ProcessFailure.from_exit(0, 42, 3, None, 1.0)
    cause = describe(f, 5, str(log))
    assert (
        cause.headline
        == "exited with code 3 (rank 5); its last stderr line: retrying failed, giving up"
    )


def test_signal_causes() -> None:
    kill, term = signal.SIGKILL, signal.SIGTERM
    oom = OomRise("/sys/fs/cgroup/memory/job/memory.oom_control", 0, 1, host_wide=False)
    assert signal_cause(kill, (), oom, True) == (
        "killed by the OOM killer: out of memory (SIGKILL; memory cgroup /job: oom_kill 0 -> 1)"
    )
    host = OomRise("/proc/vmstat", 3, 4, host_wide=True)
    assert signal_cause(kill, (), host, False).startswith("killed by SIGKILL, probably by the OOM")
    # the agent's own SIGKILL is never taken for the OOM killer's
    assert signal_cause(kill, (term, kill), oom, True).startswith(
        "killed by the agent with SIGKILL"
    )
    assert signal_cause(term, (term,), None, True) == "stopped by the agent with SIGTERM"
    assert "no OOM kill counted" in signal_cause(kill, (), None, True)
    assert "no memory cgroup" in signal_cause(kill, (), None, False)
    assert signal_cause(signal.SIGHUP, (), None, True) == "killed by SIGHUP from outside the agent"
    assert signal_cause(signal.SIGBUS, (), None, True).startswith("crashed with SIGBUS")


def test_cgroup_v2_memory_events_are_read(tmp_path: Path) -> None:
    # cgroup v2 is not mounted on this machine (v1 is, and the agent tests use it): a v2 tree
    # laid out as the kernel does, in a temporary root
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cgroup").write_text("0::/job.slice/step\n")
    group = tmp_path / "cg" / "job.slice" / "step"
    group.mkdir(parents=True)
    events = group / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n")
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 1\noom_kill 9\n")
    counter = OomCounter(str(tmp_path / "proc" / "cgroup"), str(tmp_path / "cg"), str(vmstat))
    assert counter.files == [str(events)] and counter.covered()
    before = counter.snapshot()
    assert counter.rise(before) is None
    events.write_text("oom 2\noom_kill 2\n")
    vmstat.write_text("oom_kill 10\n")
    rise = counter.rise(before)
    assert rise is not None and (rise.source, rise.before, rise.after) == (str(events), 1, 2)


def test_torchs_rank_prefix_is_read_through() -> None:
    # B12: torch's excepthook after init_process_group prefixes each line with "[rankN]: "
    # (blank lines stay bare); the lines of another rank or process in between are not ours
    text = (
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/job/train.py", line 40, in <module>\n'
        "[rank0]: Traceback (most recent call last):\n"
        "[rank1]:     main()\n"
        "W1127 05:33:47 gloo: connection reset\n"
        '[rank0]:   File "/job/train.py", line 41, in <module>\n'
        '[rank1]:   File "/job/model.py", line 5, in forward\n'
        '[rank1]:     raise ValueError("bad shape in batch 7")\n'
        "[rank0]:     dist.barrier()\n"
        "[rank1]: ValueError: bad shape in batch 7\n"
        "[rank0]: RuntimeError: Connection closed by peer\n"
    )
    tb = parse_traceback(text)
    assert tb is not None  # the last header is rank 0's: its own lines make its traceback
    assert tb.exception == "RuntimeError: Connection closed by peer" and tb.where == "train.py:41"
    tb = parse_traceback(text.replace("[rank0]: Traceback (most recent call last):\n", ""))
    assert tb is not None
    assert tb.exception == "ValueError: bad shape in batch 7" and tb.where == "model.py:5"
    assert tb.text == "\n".join(TB.splitlines()[1:]) and "[rank" not in tb.text


def test_a_rank_prefixed_chain_keeps_its_causes() -> None:
    chain = (
        "Traceback (most recent call last):\n"
        '  File "/job/cfg.py", line 3, in get\n'
        "KeyError: 'lr'\n"
        "\n"
        "The above exception was the direct cause of the following exception:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "/job/cfg.py", line 5, in get\n'
        "RuntimeError: config has no learning rate\n"
    )
    text = "\n".join(f"[rank2]: {x}" if x else "" for x in chain.split("\n"))
    tb = parse_traceback(text)
    assert tb is not None and tb.text == chain.rstrip("\n")
    assert tb.exception == "RuntimeError: config has no learning rate" and tb.where == "cfg.py:5"


def test_keyboard_interrupt_without_its_source_line_is_not_pinned(tmp_path: Path) -> None:
    # M1: with no source line shown (the file is gone) a raise cannot be told from a SIGINT
    log = tmp_path / "stderr.log"
    log.write_text(
        'Traceback (most recent call last):\n  File "/gone/t.py", line 3, in <module>\n'
        "KeyboardInterrupt\n"
    )
    f = ProcessFailure.from_exit(0, 42, -signal.SIGINT, None, 1.0)
    assert describe(f, 1, str(log)).headline == (
        "KeyboardInterrupt in the worker (SIGINT from outside the agent, or raised by it) "
        "(rank 1, t.py:3)"
    )
    # the agent's own SIGINT (its shutdown) stays the agent's
    stopped = describe(f, 1, str(log), (signal.SIGINT,)).headline
    assert stopped == "stopped by the agent with SIGINT (rank 1)"


def test_an_oom_count_is_only_a_fact_for_the_kernels_victim_or_a_cgroup_of_our_own(
    tmp_path: Path,
) -> None:
    # P2: the counter is the cgroup's; /dev/kmsg names the victim where it can be read, and
    # where it cannot (a file that is not there stands in: not root, dmesg_restrict) a cgroup
    # holding processes besides this agent's makes it "probably"
    group = tmp_path / "job"
    group.mkdir()
    counter = str(group / "memory.oom_control")
    child = subprocess.Popen(["sleep", "60"])
    others: list[int] = []
    try:
        (group / "cgroup.procs").write_text(f"{os.getpid()}\n{child.pid}\n")
        gone = str(tmp_path / "no-kmsg")
        alone = OomRise(counter, 0, 1, False, time.monotonic(), gone)
        assert signal_cause(signal.SIGKILL, (), alone, True, child.pid).startswith(
            "killed by the OOM killer: out of memory (SIGKILL; memory cgroup "
        )
        # what launched the agent is its own (alive, so not the victim)
        (group / "cgroup.procs").write_text(f"{os.getpid()}\n{child.pid}\n{os.getppid()}\n")
        mine = OomRise(counter, 0, 1, False, time.monotonic(), gone)
        assert signal_cause(signal.SIGKILL, (), mine, True, child.pid).startswith(
            "killed by the OOM"
        )
        # a process of someone else's (an orphan: its parent is gone) is not
        orphan = subprocess.run(
            ["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True
        )
        others.append(int(orphan.stdout))
        (group / "cgroup.procs").write_text(f"{os.getpid()}\n{child.pid}\n{others[0]}\n")
        shared = OomRise(counter, 0, 1, False, time.monotonic(), gone)
        assert signal_cause(signal.SIGKILL, (), shared, True, child.pid) == (
            f"killed by SIGKILL, probably by the OOM killer (memory cgroup {group}: oom_kill "
            "0 -> 1; the cgroup also holds processes other than this agent's)"
        )
        # the kernel's record decides, either way; records from before the attempt are old news
        now = int(time.monotonic() * 1e6)
        kmsg = tmp_path / "kmsg"
        kmsg.write_text(
            f"3,10,{now - 60_000_000},-;Memory cgroup out of memory: Killed process {child.pid} (x)\n"
            f"6,11,{now},-;oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg={group}/sub,"
            "task=python,pid=4242,uid=0\n"
            f"3,12,{now},-;Memory cgroup out of memory: Killed process 4242 (python) total-vm:1kB\n"
            " SUBSYSTEM=memory\n"
            # another job's kill elsewhere on the host is none of this cgroup's count
            f"6,13,{now},-;oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg={group}2,pid=5151\n"
        )
        told = OomRise(counter, 0, 1, False, time.monotonic(), str(kmsg))
        assert signal_cause(signal.SIGKILL, (), told, True, child.pid) == (
            "killed by SIGKILL from outside the agent (kill -9; the kernel's log names pid 4242 "
            f"as the OOM killer's victim in memory cgroup {group}: oom_kill 0 -> 1)"
        )
        assert signal_cause(signal.SIGKILL, (), told, True, 4242).startswith("killed by the OOM")
    finally:
        child.kill()
        child.wait()
        for pid in others:
            os.kill(pid, signal.SIGKILL)
