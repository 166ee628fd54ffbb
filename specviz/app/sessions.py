"""One visitor's state (kept in gr.State), and the server-wide bound on sessions holding a decoder.

A decoder holds KV caches (megabytes to gigabytes), so a server keeps at most `SPECVIZ_MAX_SESSIONS`
sessions with a live decoder or race. A session idle for `SPECVIZ_SESSION_IDLE_S` seconds gives its
decoder back when room is needed (its visitor's next Step starts over and is told why); when every
live session is busy, a new one gets a clear "server is busy" message and other sessions go on.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from time import monotonic

from .settings import Settings, UserError
from .stacks import get_stack, new_decoder
from .words import missing_sentence
from .. import auto_choice
from ..environment import env_number

MAX_LIVE_SESSIONS = int(env_number("SPECVIZ_MAX_SESSIONS", 16))
SESSION_IDLE_S = env_number("SPECVIZ_SESSION_IDLE_S", 900)


@dataclass(eq=False)
class Session:
    """Kept in gr.State: one decoder per browser session. `lock` keeps two events of the same user
    from stepping one decoder at once; `run_id` tells a running loop that Stop, Reset or a newer
    run took over, so it ends instead of waiting on anything."""
    decoder: object = None
    settings: Settings | None = None
    race: object = None                 # the Compare race (specviz.app.race.Race), if one ran
    regime: dict | None = None          # the cost curves of the last live race's stack (specviz.app.regime)
    recording: object = None            # an open recording (specviz.recording.Recording): views replay it
    run_id: int = 0
    stopped_run: int = -1               # the run that Stop ended, so its loop can say so
    looping: int = -1                   # the run whose Run/Compare loop is going on, if any
    last_used: float = 0.0
    released: bool = False              # its decoder was given back while idle
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def reset(self) -> None:
        """Start over: a new generation next Step, or an open recording from its first step."""
        self.decoder, self.settings, self.race = None, None, None
        if self.recording is not None:
            from .record import settings_of
            self.decoder, self.settings = self.recording.step_lane(), settings_of(self.recording)
        LIVE.forget(self)
        self.new_run()

    def stop(self) -> None:
        self.stopped_run = self.run_id
        self.new_run()

    def loop(self, body):
        """Run a Run/Compare loop, body(run_id) (a generator), under a new run id, so that Stop
        can tell that a loop is going on."""
        run_id = self.looping = self.new_run()
        try:
            yield from body(run_id)
        finally:
            self.end_loop(run_id)

    def end_loop(self, run_id: int) -> None:
        if self.looping == run_id:
            self.looping = -1

    def new_run(self) -> int:
        """A new Run/Compare loop takes over; older loops of this session see the change and stop."""
        self.run_id += 1
        return self.run_id

    def decoder_for(self, settings: Settings) -> tuple[object, str]:
        """The current decoder, or a fresh one when there is none or the settings changed."""
        note = ""
        if self.recording is not None:          # a replay: no model, the recorded settings
            return self.decoder, note
        LIVE.admit(self)
        if self.released:
            note, self.released = "This session was idle, so its generation was released: started a new one.", False
        if self.decoder is not None and settings != self.settings:
            note = "Settings changed: started a new generation."
            self.decoder = None
        if self.decoder is None:
            stack = get_stack(settings.stack_key())
            self.decoder, self.settings = new_decoder(stack, settings), settings
            lacking = missing_sentence(auto_choice.missing_line())        # the page says it in its status line
            note = " ".join(part for part in (note, lacking) if part)
        return self.decoder, note

    def release(self) -> None:
        """Give the decoder and race back (their caches are freed); the visitor is told on return."""
        self.decoder, self.settings, self.race = None, None, None
        self.released = True
        self.new_run()          # a loop of this session, if any, ends


class LiveSessions:
    """The sessions that hold a decoder or a race, bounded in number."""

    def __init__(self, limit: int, idle_s: float):
        self.limit, self.idle_s = limit, idle_s
        self.sessions: dict[int, Session] = {}
        self.lock = threading.Lock()

    def admit(self, session: Session) -> None:
        now = monotonic()
        with self.lock:
            if id(session) not in self.sessions and len(self.sessions) >= self.limit:
                idle = [s for s in self.sessions.values() if now - s.last_used > self.idle_s and s.looping < 0]
                for other in sorted(idle, key=lambda s: s.last_used)[: len(self.sessions) - self.limit + 1]:
                    other.release()
                    del self.sessions[id(other)]
            if id(session) not in self.sessions and len(self.sessions) >= self.limit:
                raise UserError(f"The server is busy: {self.limit} sessions are decoding. Try again in a few "
                                "minutes.")
            self.sessions[id(session)] = session
            session.last_used = now

    def forget(self, session: Session) -> None:
        with self.lock:
            self.sessions.pop(id(session), None)


LIVE = LiveSessions(MAX_LIVE_SESSIONS, SESSION_IDLE_S)
