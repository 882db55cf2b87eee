"""searchrl/processes.py: the one stop of a child process (signal, grace, SIGKILL, its process group), with real
children: a signal it handles ends it within the grace, one it ignores costs the grace and then SIGKILL, and a
child leading a group of its own takes the whole group with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from searchrl.processes import stop_process

# A child that exits 7 on SIGTERM or ignores it; with GRANDCHILD it first starts one that ignores SIGTERM (a
# scheduler or Ray worker left behind), and prints its pid once both handlers are set.
CHILD = """
import signal, subprocess, sys, time
ON_TERM, GRANDCHILD = sys.argv[1], sys.argv[2] == "1"
signal.signal(signal.SIGTERM, (lambda *_: sys.exit(7)) if ON_TERM == "exit" else signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, even if the test runs as a background job
pid = 0
if GRANDCHILD:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(600)"
    grandchild = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    grandchild.stdout.readline()
    pid = grandchild.pid
print(pid, flush=True)
time.sleep(600)
"""


def _start(
    on_term: str, *, grandchild: bool = False, new_session: bool = False
) -> tuple[subprocess.Popen[str], int]:
    """The child, once its handlers are set; and its grandchild's pid (0: none)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, on_term, "1" if grandchild else "0"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=new_session,
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def _alive(pid: int) -> bool:
    """Running, not a zombie: a killed grandchild is reparented, and its new parent may be slow to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_child_that_honours_sigterm_exits_within_the_grace_with_its_own_code() -> None:
    proc, _ = _start("exit")
    started = time.monotonic()
    assert stop_process(proc, grace_s=30) == 7
    assert time.monotonic() - started < 10  # not the grace: it exited on the signal
    assert stop_process(proc) == 7  # stopped already: its (maybe reused) pid is not signalled again


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    proc, _ = _start("ignore")
    started = time.monotonic()
    assert stop_process(proc, grace_s=1.0) == -signal.SIGKILL
    assert 1.0 <= time.monotonic() - started < 10


def test_the_signal_is_the_callers_choice() -> None:
    """verl gets SIGINT (its atexit stops Ray); a child that ignores only SIGTERM ends on it at once."""
    proc, _ = _start("ignore")
    started = time.monotonic()
    assert (
        stop_process(proc, grace_s=30, sig=signal.SIGINT) == -signal.SIGINT
    )  # Python's KeyboardInterrupt exit
    assert time.monotonic() - started < 10


def test_a_group_leader_takes_its_whole_group_with_it() -> None:
    """A leader that exits on SIGTERM at once leaves no grandchild behind, though that one ignores SIGTERM: the
    group gets SIGKILL as soon as the leader is gone, not after the grace."""
    proc, grandchild = _start("exit", grandchild=True, new_session=True)
    assert _alive(grandchild)
    started = time.monotonic()
    assert stop_process(proc, grace_s=30) == 7
    assert time.monotonic() - started < 10
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:  # SIGKILL is delivered, not awaited
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_a_group_that_ignores_sigterm_is_killed_whole_after_the_grace() -> None:
    proc, grandchild = _start("ignore", grandchild=True, new_session=True)
    started = time.monotonic()
    assert stop_process(proc, grace_s=1.0) == -signal.SIGKILL
    assert time.monotonic() - started >= 1.0
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_a_child_in_our_own_group_is_signalled_alone() -> None:
    """A child started without a session of its own shares the caller's group: only it is signalled (the group
    would include the caller), so its grandchild lives on, as it did before this function existed."""
    proc, grandchild = _start("exit", grandchild=True)
    try:
        assert stop_process(proc, grace_s=30) == 7
        time.sleep(0.2)
        assert _alive(grandchild)
    finally:
        os.kill(grandchild, signal.SIGKILL)


# `searchrl <verb>` with the parsed handler swapped for one that supervises a stand-in for verl (a session of its own
# that prints its pid and sleeps), as the CPU runs and the launch do, after printing whether SIGTERM's handler is the
# one the process started with: SIGTERM to `train` must stop the stand-in, not orphan it.
VERB_CHILD = """
import signal, sys
from searchrl import cli
from searchrl.trainer.supervisor import supervise

started_with = signal.getsignal(signal.SIGTERM)

def handler(args):
    print("handler kept", signal.getsignal(signal.SIGTERM) == started_with, flush=True)
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(600)"
    supervise([sys.executable, "-c", code], on_line=lambda line: print("verl", line.strip(), flush=True))
    return 0

build = cli.build_parser
def build_swapped():
    parser = build()
    parse = parser.parse_args
    def parse_args(argv=None):
        args = parse(argv)
        args.handler = handler
        return args
    parser.parse_args = parse_args
    return parser
cli.build_parser = build_swapped
sys.exit(cli.main(sys.argv[1:]))
"""


def _verb(*argv: str) -> tuple[subprocess.Popen[str], bool, int]:
    """The CLI with `argv`, once its stand-in for verl runs: whether the handler saw SIGTERM's starting handler,
    and the stand-in's pid."""
    proc = subprocess.Popen(
        [sys.executable, "-c", VERB_CHILD, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    kept, verl = proc.stdout.readline().split(), proc.stdout.readline().split()
    assert kept[:2] == ["handler", "kept"] and verl[0] == "verl", (kept, verl)
    return proc, kept[2] == "True", int(verl[1])


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


def test_sigterm_to_searchrl_train_stops_what_it_started_and_exits_143() -> None:
    """The defect (2026-12-07): `searchrl train learn-search` killed with SIGTERM died at once and left verl (its
    own session), Ray and the BM25 service running. Inside `train` SIGTERM now unwinds like Ctrl-C: the supervisor
    stops verl's whole group, and the CLI says so and exits 128 + 15."""
    proc, kept, verl = _verb("train", "cpu")
    assert not kept and _alive(verl) and os.getpgid(verl) == verl  # its own session: a group signal misses it
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert (
        proc.stderr is not None
        and "stopped by SIGTERM; what the run started was stopped" in proc.stderr.read()
    )
    assert _gone(verl)


def test_outside_train_sigterm_keeps_the_handler_the_process_started_with() -> None:
    """Only `train` unwinds: another verb (`serve` keeps uvicorn's own drain and its -15 exit status) runs with the
    SIGTERM handler it started with, so SIGTERM ends it as before (the stand-in then goes with its own session's
    owner only when someone stops it: here the test does)."""
    proc, kept, verl = _verb("health", "http://127.0.0.1:9")
    try:
        assert kept
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM
    finally:
        os.killpg(verl, signal.SIGKILL)
    assert _gone(verl)
