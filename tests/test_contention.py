"""Other work on the device during a timed window (edgekit/agent/contention.py): the /proc
accounting with real processes that burn CPU, the record field, and real local benches timed
beside a CPU hog and without one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import EXAMPLES

from edgekit.agent.contention import CONTENDED_SHARE, contention, snapshot, ticks_used
from edgekit.bench.record import make_record, merge_rounds
from edgekit.errors import AgentError
from tests.builders import bench_doc

pytestmark = pytest.mark.skipif(snapshot() is None, reason="no Linux /proc here: the agent reports no contention")

MODEL = EXAMPLES / "digits" / "digits_cnn.onnx"
CORES = os.cpu_count() or 1
BURN = "while True: pass"
# a process that keeps starting short CPU-burning children and reaps them: what a compile looks like
SPAWNER = (
    "import subprocess, sys\n"
    "burn = 'import time\\nt = time.time()\\nwhile time.time() - t < 0.05: pass'\n"
    "while True: subprocess.run([sys.executable, '-c', burn])\n"
)


def _orphan(code: str) -> int:
    """Start ``code`` in a process whose parent exits at once (not a descendant of this one); its pid."""
    launcher = f"import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', {code!r}], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"
    return int(subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True, check=True, timeout=30).stdout)


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, 9)  # the orphan leads its own session: its children go with it
    except ProcessLookupError:
        pass


def _window(seconds: float) -> tuple[dict, dict]:
    before = snapshot()
    time.sleep(seconds)
    return before, snapshot()


def _other_cpu_now(seconds: float = 1.0) -> dict:
    """How busy the rest of this machine is over ``seconds`` (this process and its children excluded)."""
    before, after = _window(seconds)
    return contention(before, after, CORES, "loop")


# -- the /proc accounting, with real processes -----------------------------------------------
def _used(before: dict, after: dict, pid: int) -> int:
    """The ticks ``pid`` used between two snapshots, from its own /proc/[pid]/stat."""
    (key,) = [k for k in after["procs"] if k[0] == pid]
    return after["procs"][key][1] - before["procs"][key][1]


def test_a_process_that_is_not_ours_is_counted_and_our_own_child_is_not():
    other = _orphan(BURN)
    child = subprocess.Popen([sys.executable, "-c", BURN])  # a descendant: the bench's own (ekrt's runner)
    try:
        time.sleep(0.2)
        before, after = _window(0.6)
    finally:
        _kill(other)
        child.kill()
        child.wait()
    c = contention(before, after, CORES, "loop")
    assert c["span"] == "loop" and 0.55 < c["window_s"] < 1.5
    assert c["limit"] == CONTENDED_SHARE  # the bench takes every core: any quarter of a core is in its way
    ticks = {pid: t for t, pid, _ in ticks_used(before["procs"], after["procs"], os.getpid())[0]}
    assert _used(before, after, child.pid) > 0 and child.pid not in ticks  # it burnt CPU, and it is ours
    assert os.getpid() not in ticks and os.getppid() not in ticks
    assert ticks[other] == _used(before, after, other) > 0
    tck = os.sysconf("SC_CLK_TCK")
    assert c["other_cpu"] > 0 and c["contended"] is True, c
    named = {p["pid"]: p for p in c["top"]}  # the busiest 3: on a busy shared machine the hog may not be one
    if other in named:  # its share of a core: from the unrounded window (the record keeps window_s to 4 places)
        assert named[other]["name"].startswith("python") and abs(named[other]["cpu"] - ticks[other] / tck / c["window_s"]) <= 1e-3, (named[other], c)


def test_the_children_a_process_reaps_in_the_window_count_as_its_work():
    """Compiler processes come and go within a window; the make that reaps them shows their CPU
    in its cutime + cstime."""
    spawner = _orphan(SPAWNER)
    try:
        time.sleep(0.3)
        before, after = _window(0.8)
    finally:
        _kill(spawner)
    (key,) = [k for k in after["procs"] if k[0] == spawner]
    own = after["procs"][key][1] - before["procs"][key][1]
    reaped = after["procs"][key][2] - before["procs"][key][2]
    assert reaped > 2 * own, (own, reaped)  # its children burnt the CPU, not itself
    ticks = {pid: t for t, pid, _ in ticks_used(before["procs"], after["procs"], os.getpid())[0]}
    tck = os.sysconf("SC_CLK_TCK")
    assert own + reaped >= ticks[spawner] and ticks[spawner] / tck / 0.8 >= 0.25, (ticks[spawner], own, reaped)
    assert ticks[spawner] / tck / 0.8 < 1.1  # one child at a time: at most a core, whatever was used before the window


def _proc(ppid: int, ticks: int, reaped: int = 0, name: str = "p") -> tuple:
    return (ppid, ticks, reaped, name)


def test_who_counts_and_how_much():
    """The rules on snapshots written out: ancestors, descendants and kernel threads are not
    counted; a pid reused in the window is a new process; what a child that ended had used before
    the window is not counted again in its parent's reaped ticks."""
    me = os.getpid()
    before = {
        (1, 0): _proc(0, 100), (2, 0): _proc(0, 0), (50, 5): _proc(2, 10, name="kworker"),
        (10, 1): _proc(1, 1000, name="sshd"), (me, 2): _proc(10, 500, name="agent"), (77, 9): _proc(me, 0, name="ekrt"),
        (300, 3): _proc(1, 40, 0, name="make"), (301, 4): _proc(300, 25, 5, name="cc1"),
        (400, 3): _proc(1, 7, name="old"),
        (500, 6): _proc(1, 3, 0, name="bash"), (501, 7): _proc(500, 2, 0, name="gcc"), (502, 8): _proc(501, 60, 0, name="cc1"),
    }  # fmt: skip
    after = {
        (1, 0): _proc(0, 160), (2, 0): _proc(0, 0), (50, 5): _proc(2, 90, name="kworker"),
        (10, 1): _proc(1, 1300, name="sshd"), (me, 2): _proc(10, 900, 80, name="agent"), (77, 9): _proc(me, 80, name="ekrt"),
        (78, 20): _proc(77, 30, name="worker"),  # started in the window, the runner's
        (300, 3): _proc(1, 41, 45, name="make"),  # cc1 ended and was reaped: 45 ticks, 25 + 5 of them before the window
        (400, 30): _proc(1, 12, name="new"),  # pid 400 reused by a new process: all of its 12
        # gcc reaped cc1 (80 ticks), then bash reaped gcc (3 + 80): 62 of them before the window
        (500, 6): _proc(1, 4, 83, name="bash"),
    }  # fmt: skip
    others, mine = ticks_used(before, after, me)
    assert sorted(others) == [(12, 400, "new"), (16, 300, "make"), (22, 500, "bash")], others
    assert mine == 60 + 300 + 400 + 80 + 80 + 30  # init, sshd, the agent (80 of them reaped), ekrt, its worker


@pytest.mark.parametrize(
    "seconds, other_ticks_total, expected",
    [
        (1.0, 50, True),  # half a core for a second
        (1.0, 10, False),  # a tenth
        (0.02, 2, None),  # 20 ms: a quarter of a core would be half a tick; two are below MIN_TICKS
        (0.02, 4, True),  # ... but four ticks in 20 ms are two cores' worth: contended, whatever the size
    ],
)
def test_the_judgement_needs_enough_ticks(seconds, other_ticks_total, expected):
    me = os.getpid()
    tck = os.sysconf("SC_CLK_TCK")
    ticks = round(other_ticks_total * 100 / tck)  # the cases are written at USER_HZ 100
    before = {"ns": 0, "procs": {(me, 1): _proc(1, 0), (900, 1): _proc(1, 0, name="hog")}}
    after = {"ns": int(seconds * 1e9), "procs": {(me, 1): _proc(1, 0), (900, 1): _proc(1, ticks, name="hog")}}
    c = contention(before, after, CORES, "loop")
    assert c["contended"] is expected, c
    assert c["top"] == [{"pid": 900, "name": "hog", "cpu": round(ticks / tck / seconds, 3)}]


def test_other_work_is_never_more_than_the_machine_did_beyond_the_bench():
    """A process that ended and was reaped by a subreaper (not the parent it had) brings its whole
    life's ticks: /proc/stat's machine-wide busy ticks bound what the others can have used."""
    me = os.getpid()
    before = {"ns": 0, "busy": 1000, "procs": {(me, 1): _proc(1, 0), (900, 1): _proc(1, 0, 0, name="subreaper")}}
    after = {"ns": 10**9, "busy": 1100, "procs": {(me, 1): _proc(1, 90), (900, 1): _proc(1, 0, 400, name="subreaper")}}
    c = contention(before, after, CORES, "loop")
    tck = os.sysconf("SC_CLK_TCK")
    assert c["other_cpu"] == round(10 / tck, 3) and c["top"][0]["cpu"] == round(400 / tck, 3)  # 100 busy, 90 of them the bench's
    assert contention({**before, "busy": None}, after, CORES, "loop")["other_cpu"] == round(400 / tck, 3)  # no /proc/stat: no bound


def test_the_limit_leaves_the_cores_the_bench_does_not_use():
    me = os.getpid()
    before = {"ns": 0, "procs": {(me, 1): _proc(1, 0)}}
    after = {"ns": 10**9, "procs": {(me, 1): _proc(1, 0)}}
    assert contention(before, after, 1, "loop")["limit"] == CONTENDED_SHARE + max(0, CORES - 2)
    assert contention(before, after, None, "loop")["limit"] == CONTENDED_SHARE  # the runtime's default: all cores
    assert contention(before, None, 1, "loop") is None  # no /proc: no claim either way


# -- the record ---------------------------------------------------------------------------------
def _busy(other: float, contended, pid: int = 4242, name: str = "stress") -> dict:
    return {"span": "loop", "window_s": 1.0, "other_cpu": other, "limit": 0.25, "contended": contended,
            "top": [{"pid": pid, "name": name, "cpu": other}] if other else []}  # fmt: skip


def test_the_record_keeps_contention_and_refuses_a_malformed_one():
    record = make_record(bench_doc(contention=_busy(0.97, True)), model_name="m", target="rpi5", device="pi")
    assert record["agent"]["contention"]["top"][0]["pid"] == 4242
    assert make_record(bench_doc(), model_name="m", target="rpi5", device="pi")["agent"].get("contention") is None  # older agents
    for bad in ({"other_cpu": 0.5}, {**_busy(0.5, True), "contended": "yes"}, {**_busy(0.5, True), "top": [{"pid": "x"}]}, 3):
        with pytest.raises(AgentError, match="contention"):
            make_record(bench_doc(contention=bad), model_name="m", target="rpi5", device="pi")


def test_rounds_are_contended_when_any_was():
    docs = [bench_doc(contention=_busy(0.02, False)), bench_doc(contention=_busy(0.97, True)), bench_doc(contention=_busy(0.1, False))]
    merged = merge_rounds(docs)
    assert merged["contention"]["contended"] is True and merged["contention"]["other_cpu"] == 0.97
    assert [r["contention"]["contended"] for r in merged["rounds"]] == [False, True, False]
    clean = merge_rounds([bench_doc(contention=_busy(0.02, False)), bench_doc(contention=_busy(0.1, False))])
    assert clean["contention"]["contended"] is False and clean["contention"]["other_cpu"] == 0.1
    # a round that could not be judged (too short), or has no /proc reading: the run is not called clean
    assert merge_rounds([bench_doc(contention=_busy(0.02, False)), bench_doc(contention=_busy(0.0, None))])["contention"]["contended"] is None
    assert merge_rounds([bench_doc(contention=_busy(0.02, False)), bench_doc()])["contention"]["contended"] is None
    assert merge_rounds([bench_doc(), bench_doc()])["contention"] is None


# -- real local benches ---------------------------------------------------------------------------
def _bench(*gates: str) -> tuple[dict, dict]:
    """(the stored record, each --fail gate's result by its text) of a real local bench."""
    # threads = cores: the bench wants every core, so one hog anywhere is in its way on any machine
    argv = [sys.executable, "-m", "edgekit", "bench", str(MODEL), "--target", "local", "--threads", str(CORES), "--duration", "1", "--json"]
    argv += [a for g in gates for a in ("--fail", g)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env={**os.environ, "CI": "1"})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    (record,) = doc["runs"] if gates else doc
    return record, {g["gate"]: g for g in doc["gates"]} if gates else {}


def test_a_bench_timed_beside_a_cpu_hog_is_contended_and_names_it(cli):
    hog = subprocess.Popen([sys.executable, "-c", BURN])
    try:
        time.sleep(0.3)
        record, gates = _bench("p50:<0.0001ms", "p99:<60000ms")
    finally:
        hog.kill()
        hog.wait()
    c = record["agent"]["contention"]
    assert c["span"] == "loop" and 0.95 <= c["window_s"] < 3, c  # the timed loop of --duration 1, not the load
    named = {p["pid"]: p for p in c["top"]}
    assert hog.pid in named and named[hog.pid]["cpu"] >= CONTENDED_SHARE, c
    assert c["contended"] is True, c
    # the failure the hog could explain is withheld, the pass it could not is kept
    failed, passed = gates["p50:<0.0001ms"], gates["p99:<60000ms"]
    assert failed["status"] == "inconclusive" and "(the device ran other work during the candidate's timed window: " in failed["line"], failed
    assert f"pid {hog.pid} (" in failed["line"]
    assert passed["status"] == "pass" and "pass (held although the device ran other work" in passed["line"], passed
    shown = cli("results", "show", str(record["id"]))
    assert shown.returncode == 0 and "contended: other work on the device used " in shown.stderr and f"pid {hog.pid} (" in shown.stderr, shown


def test_a_bench_on_a_quiet_machine_is_not_contended():
    """The bench's own processes (the agent, the CLI that started it, this test) never count. The
    machine is shared: the run only has to be clean when the rest of it was quiet just before and
    just after (measured here, the same way, outside the bench); three tries."""
    tries = []
    for _ in range(3):
        quiet_before = _other_cpu_now()
        record, _ = _bench()
        quiet_after = _other_cpu_now()
        c = record["agent"]["contention"]
        tries.append((quiet_before["other_cpu"], c, quiet_after["other_cpu"]))
        if max(quiet_before["other_cpu"], quiet_after["other_cpu"]) < 0.1:
            assert c["contended"] is False and c["other_cpu"] < CONTENDED_SHARE, tries
            assert 0.95 <= c["window_s"] < 3
            return
    pytest.skip(f"the machine was busy around every try (other work before, during, after): {tries}")
