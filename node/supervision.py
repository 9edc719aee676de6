"""The supervisor's restart policy, with no I/O: which actors start when, and what a death,
a silence or a refusal leads to. ``node/supervisor.py`` is the shell: it owns the
processes, the sockets and psutil, tells this state what it saw, and carries out the
instructions (``Spawn``, ``Release``, ``Terminate``, ``StopNode``) that come back.

Each actor is ``stopped`` (not started, or stopped by the supervisor), ``waiting``
(spawned, not yet let start), ``starting`` (let start, not yet heard from) or ``running``
(it has reported).

    start       every actor to start is spawned at once, and each process imports what it
                runs and then waits; they are let start (``Release``) in stages
                (``start_stages``): one by one in start order, the shard writers together;
                a stage is let start once every actor of the stage before it is running,
                and must be running within its start timeout. (Spawned stage by stage, the
                actors imported one after the other: an empty node served in 2.2-2.4 s
                here, against 1.4-1.7 s so.)
    report      an actor's figures (``Stats``, about once a second) are its heartbeat; the
                first says it is running
    silence     a running actor not heard from for ``heartbeat_s`` is killed; its exit is a
                death like any other
    death       rest-for-one: the actors started after it are stopped, the last first, and
                it and they start again, as at the start (what they hold may depend on it)
    budget      a death beyond ``restarts_max`` restarts within ``restart_window_s`` stops
                the node instead, with the reason
    refused     an actor that exits with ``EXIT_REFUSED`` (a corrupt log, a newer shard
                format) stops the node: started again, it would only refuse again
    start fails an actor that exits before its first report (waiting or starting), or a
                stage not running in time, stops the node

Once the node stops (``StopNode``, or ``stop`` from the shell) nothing more is started.
"""

from __future__ import annotations

import collections
import enum
import logging
from dataclasses import dataclass

from actors.instructions import Release, Spawn, StopNode, Terminate
from actors.process import EXIT_REFUSED
from actors.roles import is_writer

log = logging.getLogger("shardnode")

# The instructions (actors/instructions.py) the supervisor carries out.
SupervisorInstruction = Spawn | Release | Terminate | StopNode


def start_stages(roles: list[str]) -> list[list[str]]:
    """``roles`` in start order, grouped into stages that start together: each actor on
    its own, except the shard writers, which depend only on the actors before them and
    not on each other, so they recover (replay the log) side by side."""
    stages: list[list[str]] = []
    for role in roles:
        if is_writer(role) and stages and is_writer(stages[-1][0]):
            stages[-1].append(role)
        else:
            stages.append([role])
    return stages


class Phase(enum.Enum):
    STOPPED = "stopped"
    WAITING = "waiting"
    STARTING = "starting"
    RUNNING = "running"


@dataclass
class Watched:
    """What the policy knows of one actor."""

    phase: Phase = Phase.STOPPED
    pid: int = 0
    last_report: float = 0.0  # when it was last heard from (or spawned)
    restarts: int = 0


class Supervision:
    def __init__(self, order: list[str], restarts_max: int, restart_window_s: float,
                 heartbeat_s: float, restart_start_s: float) -> None:
        self.order = order
        self.restarts_max = restarts_max
        self.restart_window_s = restart_window_s
        self.heartbeat_s = heartbeat_s
        self.restart_start_s = restart_start_s  # a restarted stage's start timeout
        self.actors = {role: Watched() for role in order}
        self.stages: list[list[str]] = []  # still to start; the first is starting, the rest wait
        self.stage_timeout_s = 0.0
        self.stage_deadline = 0.0
        self.restart_times: collections.deque[float] = collections.deque()  # in the window
        self.stopping = False

    @property
    def up(self) -> bool:
        """Every actor is running, and none waits to be started."""
        return not self.stages and all(a.phase is Phase.RUNNING for a in self.actors.values())

    def watches(self, role: str) -> bool:
        """Whether an exit of ``role``'s process is news (it is not stopped)."""
        return self.actors[role].phase is not Phase.STOPPED

    # ---- events -------------------------------------------------------------------

    def start(self, now: float, timeout_s: float) -> list[SupervisorInstruction]:
        """Start the node: every actor, let start in stages, each within ``timeout_s``."""
        self.stage_timeout_s = timeout_s
        return self._spawn(self.order, now)

    def spawned(self, role: str, pid: int) -> None:
        """The shell started ``role``'s process (``Spawn``) as ``pid``."""
        self.actors[role].pid = pid

    def reported(self, role: str, now: float) -> list[SupervisorInstruction]:
        """``role``'s process (the one spawned last) sent its figures."""
        actor = self.actors[role]
        if actor.phase in (Phase.STOPPED, Phase.WAITING):  # (a waiting one cannot report)
            return []
        actor.last_report = now
        if actor.phase is Phase.RUNNING:
            return []
        actor.phase = Phase.RUNNING
        if not self.stages or role not in self.stages[0]:
            return []
        if any(self.actors[r].phase is not Phase.RUNNING for r in self.stages[0]):
            return []
        self.stages.pop(0)
        return self._release_stage(now) if self.stages and not self.stopping else []

    def exited(self, role: str, exitcode: int, now: float) -> list[SupervisorInstruction]:
        """``role``'s process exited with ``exitcode``."""
        actor = self.actors[role]
        if self.stopping or actor.phase is Phase.STOPPED:
            return []
        was, actor.phase = actor.phase, Phase.STOPPED
        if was in (Phase.WAITING, Phase.STARTING):
            why = ("refused to start" if exitcode == EXIT_REFUSED
                   else f"exited with code {exitcode} while starting")
            return self._stop(f"the {role} actor {why}; its log above says why")
        if exitcode == EXIT_REFUSED:
            return self._stop(f"{role} refused to run; its log above says why")
        window = self.restart_window_s
        while self.restart_times and now - self.restart_times[0] > window:
            self.restart_times.popleft()
        if len(self.restart_times) >= self.restarts_max:
            return self._stop(f"{len(self.restart_times) + 1} actor restarts within {window} s "
                              f"(last: {role} exited with code {exitcode}); giving up")
        self.restart_times.append(now)
        rest = self.order[self.order.index(role) + 1:]
        for r in [role, *rest]:
            self.actors[r].restarts += 1
        log.warning("%s (pid %d) exited with code %s; restarting it and %s (restart %d)",
                    role, actor.pid, exitcode, rest or "nothing after it", actor.restarts)
        out: list[SupervisorInstruction] = []
        for r in reversed(rest):  # rest-for-one: those started after it go too
            if self.actors[r].phase is not Phase.STOPPED:
                self.actors[r].phase = Phase.STOPPED
                out.append(Terminate(r))
        self.stage_timeout_s = self.restart_start_s
        return out + self._spawn([role, *rest], now)

    def tick(self, now: float) -> list[SupervisorInstruction]:
        """Time passed: a stage late to start, actors gone silent."""
        if self.stopping:
            return []
        if self.stages and now > self.stage_deadline:
            return self._stop(f"actors {self.stages[0]} did not start within "
                              f"{self.stage_timeout_s:.0f} s")
        out: list[SupervisorInstruction] = []
        for role in self.order:
            actor = self.actors[role]
            if actor.phase is Phase.RUNNING and now - actor.last_report > self.heartbeat_s:
                log.error("%s (pid %d) silent for %.0f s; killing it", role, actor.pid,
                          self.heartbeat_s)
                out.append(Terminate(role, kill=True))
        return out

    def stop(self) -> None:
        """The node is stopping (a signal, a clean stop): start nothing more."""
        self.stopping = True

    # ---- helpers ------------------------------------------------------------------

    def _spawn(self, roles: list[str], now: float) -> list[SupervisorInstruction]:
        """Spawn ``roles`` at once, and let the first stage of them start."""
        self.stages = start_stages(roles)
        for role in roles:
            actor = self.actors[role]
            actor.phase = Phase.WAITING
            actor.last_report = now
        spawns: list[SupervisorInstruction] = [Spawn(role) for role in roles]
        return spawns + self._release_stage(now)

    def _release_stage(self, now: float) -> list[SupervisorInstruction]:
        stage = self.stages[0]
        self.stage_deadline = now + self.stage_timeout_s
        for role in stage:
            actor = self.actors[role]
            actor.phase = Phase.STARTING
            actor.last_report = now
        return [Release(role) for role in stage]

    def _stop(self, reason: str) -> list[SupervisorInstruction]:
        self.stopping = True
        return [StopNode(reason)]
