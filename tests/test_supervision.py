"""The supervisor's restart policy: spawned at once and let start in stages, rest-for-one,
the restart budget, heartbeat silence, refusals. No processes: events in, instructions
out."""

from __future__ import annotations

import multiprocessing
import os
import threading
from typing import Any

from actors.instructions import Release, Spawn, StopNode, Terminate
from actors.process import EXIT_FAILED, EXIT_REFUSED, send_release, wait_for_release
from node.supervision import Phase, Supervision, SupervisorInstruction, start_stages

ORDER = ["log", "txn", "cache", "writer-0", "writer-1", "front"]
HEARTBEAT_S = 10.0
START_S = 60.0
RESTART_START_S = 30.0
KILLED = -9


def policy(restarts_max: int = 5, window_s: float = 60.0) -> Supervision:
    return Supervision(list(ORDER), restarts_max, window_s, heartbeat_s=HEARTBEAT_S,
                       restart_start_s=RESTART_START_S)


def spawns(*roles: str) -> list[Spawn]:
    return [Spawn(r) for r in roles]


def releases(*roles: str) -> list[Release]:
    return [Release(r) for r in roles]


def run(p: Supervision, instructions: list[SupervisorInstruction],
        now: float) -> list[SupervisorInstruction]:
    """Carry out spawns and releases as a shell would, each actor reporting as soon as it is
    let start; returns the instructions that came back after the first ones."""
    out: list[SupervisorInstruction] = []
    pending = list(instructions)
    while pending:
        ins = pending.pop(0)
        if isinstance(ins, Spawn):
            p.spawned(ins.role, pid=1000 + ORDER.index(ins.role))
        elif isinstance(ins, Release):
            more = p.reported(ins.role, now)
            out += more
            pending += more
    return out


def up(restarts_max: int = 5, window_s: float = 60.0) -> Supervision:
    """A policy with every actor started and running, at time 0."""
    p = policy(restarts_max, window_s)
    run(p, p.start(0.0, START_S), 0.0)
    assert p.up
    return p


# ---- start -----------------------------------------------------------------------------


def test_start_spawns_every_actor_and_lets_them_start_stage_by_stage() -> None:
    p = policy()
    assert p.start(0.0, START_S) == [*spawns(*ORDER), *releases("log")]
    assert [a.phase for a in p.actors.values()] == [Phase.STARTING, *[Phase.WAITING] * 5]
    assert not p.up
    assert p.reported("log", 1.0) == releases("txn")
    assert p.reported("txn", 1.0) == releases("cache")
    assert p.reported("cache", 1.0) == releases("writer-0", "writer-1")
    assert p.reported("writer-1", 2.0) == []  # the stage waits for all its writers
    assert p.reported("writer-0", 2.0) == releases("front")
    assert not p.up
    assert p.reported("front", 3.0) == []
    assert p.up
    assert all(a.phase is Phase.RUNNING for a in p.actors.values())
    assert all(a.restarts == 0 for a in p.actors.values())


def test_a_report_from_a_waiting_actor_lets_nothing_start() -> None:
    p = policy()
    p.start(0.0, START_S)
    assert p.reported("front", 0.5) == []  # (a waiting process cannot report; say so anyway)
    assert p.actors["front"].phase is Phase.WAITING
    assert p.reported("log", 1.0) == releases("txn")


def test_start_stages_group_adjacent_writers_only() -> None:
    assert start_stages(ORDER) == [["log"], ["txn"], ["cache"], ["writer-0", "writer-1"],
                                   ["front"]]
    assert start_stages(["writer-1", "front"]) == [["writer-1"], ["front"]]


def test_a_stage_late_to_start_stops_the_node() -> None:
    p = policy()
    p.start(0.0, START_S)
    p.reported("log", 1.0)  # txn let start at 1.0 (its time counts from there)
    p.reported("log", 1.0 + START_S)  # log keeps reporting meanwhile
    assert p.tick(1.0 + START_S) == []
    assert p.tick(1.0 + START_S + 0.1) == [StopNode(f"actors ['txn'] did not start within {START_S:.0f} s")]
    assert p.tick(200.0) == []  # said once


def test_an_actor_that_refuses_to_start_stops_the_node() -> None:
    p = policy()
    p.start(0.0, START_S)
    assert p.exited("log", EXIT_REFUSED, 1.0) == [
        StopNode("the log actor refused to start; its log above says why")]
    assert p.reported("log", 2.0) == []


def test_an_actor_that_dies_while_starting_stops_the_node() -> None:
    p = policy()
    p.start(0.0, START_S)
    p.reported("log", 1.0)
    assert p.exited("txn", EXIT_FAILED, 2.0) == [
        StopNode(f"the txn actor exited with code {EXIT_FAILED} while starting; "
                 "its log above says why")]


def test_an_actor_that_dies_waiting_to_start_stops_the_node() -> None:
    p = policy()
    p.start(0.0, START_S)
    assert p.exited("front", EXIT_FAILED, 0.5) == [  # an import that failed, say
        StopNode(f"the front actor exited with code {EXIT_FAILED} while starting; "
                 "its log above says why")]
    assert p.reported("log", 1.0) == []  # stopping: nothing more is let start


def test_silence_while_starting_is_not_a_hang() -> None:
    p = policy()
    p.start(0.0, START_S)
    assert p.tick(HEARTBEAT_S + 1) == []  # log has not reported yet: the start timeout rules


# ---- death: rest-for-one -----------------------------------------------------------------


def test_a_death_restarts_it_and_those_after_it() -> None:
    p = up()
    out = p.exited("txn", KILLED, 5.0)
    assert out == [Terminate("front"), Terminate("writer-1"), Terminate("writer-0"),
                   Terminate("cache"), *spawns("txn", "cache", "writer-0", "writer-1", "front"),
                   Release("txn")]
    assert p.actors["log"].phase is Phase.RUNNING
    assert {r: a.restarts for r, a in p.actors.items()} == {
        "log": 0, "txn": 1, "cache": 1, "writer-0": 1, "writer-1": 1, "front": 1}
    # Then the stages, as at the start, with the restart's start timeout.
    assert p.reported("txn", 6.0) == releases("cache")
    assert p.reported("cache", 6.0) == releases("writer-0", "writer-1")
    assert p.tick(6.0 + RESTART_START_S + 0.1) == [
        StopNode(f"actors ['writer-0', 'writer-1'] did not start within {RESTART_START_S:.0f} s")]


def test_a_writer_death_restarts_the_writers_after_it_and_the_front_door() -> None:
    p = up()
    assert p.exited("writer-0", KILLED, 5.0) == [
        Terminate("front"), Terminate("writer-1"), *spawns("writer-0", "writer-1", "front"),
        *releases("writer-0", "writer-1")]
    assert p.watches("front")  # its new process, spawned and waiting
    p.reported("writer-0", 6.0)
    assert p.reported("writer-1", 6.0) == releases("front")
    p.reported("front", 7.0)
    assert p.up


def test_the_last_actor_restarts_alone() -> None:
    p = up()
    assert p.exited("front", EXIT_FAILED, 5.0) == [Spawn("front"), Release("front")]
    assert [a.restarts for a in p.actors.values()] == [0, 0, 0, 0, 0, 1]


def test_a_death_during_a_restart_restarts_from_the_earlier_actor() -> None:
    p = up()
    p.exited("cache", KILLED, 5.0)  # cache and those after it spawned again, cache let start
    assert p.exited("log", KILLED, 5.5) == [
        Terminate("front"), Terminate("writer-1"), Terminate("writer-0"), Terminate("cache"),
        Terminate("txn"), *spawns(*ORDER), Release("log")]
    run(p, [Release("log")], 6.0)
    assert p.up


def test_a_report_from_a_stopped_actor_changes_nothing() -> None:
    p = up()
    p.exited("writer-1", EXIT_REFUSED, 5.0)  # the node stops
    assert p.actors["writer-1"].phase is Phase.STOPPED
    assert p.reported("writer-1", 5.1) == []  # (a report sent before it exited)
    assert p.actors["writer-1"].phase is Phase.STOPPED


def test_a_restart_spawns_afresh_those_it_stops() -> None:
    p = up()
    p.exited("writer-1", KILLED, 5.0)  # the front door stopped, spawned again, waiting
    assert p.actors["front"].phase is Phase.WAITING
    assert p.reported("front", 5.1) == []  # (the old process's last report)
    assert p.actors["front"].phase is Phase.WAITING
    assert p.reported("writer-1", 5.2) == releases("front")


# ---- the restart budget ------------------------------------------------------------------


def test_too_many_restarts_in_the_window_stop_the_node() -> None:
    p = up(restarts_max=2, window_s=100.0)
    for now in (10.0, 20.0):
        assert p.exited("front", KILLED, now) == [Spawn("front"), Release("front")]
        run(p, [Release("front")], now)
    assert p.exited("front", KILLED, 30.0) == [
        StopNode("3 actor restarts within 100.0 s (last: front exited with code -9); giving up")]
    assert p.exited("log", KILLED, 31.0) == []  # stopping: nothing more starts


def test_restarts_older_than_the_window_do_not_count() -> None:
    p = up(restarts_max=2, window_s=100.0)
    for now in (10.0, 20.0):
        p.exited("front", KILLED, now)
        run(p, [Release("front")], now)
    assert p.exited("front", KILLED, 110.5) == [Spawn("front"), Release("front")]  # 10 s expired


# ---- heartbeat silence -------------------------------------------------------------------


def test_a_silent_actor_is_killed_and_its_exit_restarts_it() -> None:
    p = up()
    for role in ORDER:
        if role != "cache":
            p.reported(role, 9.0)
    assert p.tick(HEARTBEAT_S) == []  # exactly the timeout: not yet
    assert p.tick(HEARTBEAT_S + 0.1) == [Terminate("cache", kill=True)]
    assert p.exited("cache", KILLED, HEARTBEAT_S + 0.2) == [
        Terminate("front"), Terminate("writer-1"), Terminate("writer-0"),
        *spawns("cache", "writer-0", "writer-1", "front"), Release("cache")]


def test_reports_keep_an_actor_alive() -> None:
    p = up()
    for t in range(1, 30):
        for role in ORDER:
            p.reported(role, float(t))
        assert p.tick(float(t) + 0.5) == []


# ---- refusals and stopping ---------------------------------------------------------------


def test_an_actor_that_refuses_to_run_stops_the_node() -> None:
    p = up()
    assert p.exited("writer-0", EXIT_REFUSED, 5.0) == [
        StopNode("writer-0 refused to run; its log above says why")]
    assert p.tick(100.0) == []


def test_a_stopping_node_starts_nothing_more() -> None:
    p = policy()
    p.start(0.0, START_S)
    p.stop()
    assert p.reported("log", 1.0) == []  # no next stage
    assert p.exited("log", KILLED, 2.0) == []
    assert p.exited("front", 0, 2.0) == []  # a waiting one stopped with it: no news
    assert p.tick(1000.0) == []


# ---- an actor's process waits to be let start ---------------------------------------------


class NeverSent:
    """A release that never comes: ``poll`` says so at once."""

    def __init__(self) -> None:
        self.polls = 0

    def poll(self, timeout: float | None = 0.0) -> bool:
        self.polls += 1
        return False

    def recv_bytes(self, maxlength: int | None = None) -> bytes:
        raise AssertionError("nothing was sent")


def test_an_actor_waits_for_its_release_while_its_supervisor_lives() -> None:
    waits, release = multiprocessing.get_context("spawn").Pipe(duplex=False)
    let_go = threading.Timer(0.2, send_release, (release,))
    let_go.start()
    try:
        assert wait_for_release(waits, os.getppid())  # returns only once it is sent
        assert not waits.poll(0)  # and took it
    finally:
        let_go.cancel()
        waits.close()
        release.close()


def test_an_actor_whose_supervisor_is_gone_stops_waiting() -> None:
    never = NeverSent()
    assert not wait_for_release(never, os.getppid() + 1)  # not our parent: gone
    assert never.polls == 1
    waits, release = multiprocessing.get_context("spawn").Pipe(duplex=False)
    release.close()  # the supervisor's end closed (it exited): the pipe says so at once
    assert not wait_for_release(waits, os.getppid())
    waits.close()


def _wait_forever(waits: Any) -> None:
    wait_for_release(waits, os.getppid())


def test_releasing_an_actor_killed_as_it_waited_does_not_block_the_supervisor() -> None:
    """With a multiprocessing event, setting it waited for the killed waiter to wake, for
    good: the supervisor hung on a release that came after a SIGKILL."""
    ctx = multiprocessing.get_context("spawn")
    waits, release = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_wait_forever, args=(waits,), daemon=True)
    proc.start()
    waits.close()
    try:
        proc.kill()
        proc.join(10)
        assert proc.exitcode is not None
        sent: list[bool] = []
        t = threading.Thread(target=lambda: sent.append(send_release(release)), daemon=True)
        t.start()
        t.join(5)
        assert sent == [False], "the release blocked, or went to a process that is gone"
    finally:
        release.close()
