"""One visitor's state, kept in gr.State: where they are in a shared decode (specviz/app/shared_decodes.py), their
race, an open recording, and which of their loops is going on. A session holds traces and positions, never a model
or a KV cache, so a server keeps as many as visitors come."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from . import shared_decodes
from .settings import Settings
from .words import missing_sentence


@dataclass(eq=False)
class Session:
    """Kept in gr.State. `lock` keeps two events of the same user from stepping one reader at once; `run_id` tells a
    running loop that Stop, Reset or a newer run took over, so it ends instead of waiting on anything."""
    decoder: object = None              # a DecodeReader of a shared decode, or an open recording's lane
    settings: Settings | None = None
    race: object = None                 # the Compare race (specviz.app.race.Race), if one ran
    regime: dict | None = None          # the cost curves of the last live race's stack (specviz.app.regime)
    recording: object = None            # an open recording (specviz.recording.Recording): views replay it
    run_id: int = 0
    stopped_run: int = -1               # the run that Stop ended, so its loop can say so
    looping: int = -1                   # the run whose Run/Compare loop is going on, if any
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def reset(self) -> None:
        """Start over: a new generation next Step, or an open recording from its first step."""
        self.decoder, self.settings, self.race = None, None, None
        if self.recording is not None:
            from .record import settings_of
            self.decoder, self.settings = self.recording.step_lane(), settings_of(self.recording)
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
        """The current reader, or one at the first round of the settings' shared decode where there is none, the
        settings changed, or its decode was released while idle. Raises decoder_slots.InLine, changing nothing,
        while the decode waits for a live decoder."""
        if self.recording is not None:          # a replay: no model, the recorded settings
            return self.decoder, ""
        note = ""
        if self.decoder is not None and settings != self.settings:
            note = "Settings changed: started a new generation."
        elif self.decoder is not None and self.decoder.released:
            note = "This generation was idle, so the server gave its memory back: started a new one."
        if self.decoder is None or note:
            reader, shared = shared_decodes.SHARED.reader(settings)
            self.decoder, self.settings = reader, settings
            lacking = missing_sentence(reader.shared.profile.missing_line())     # the page says it in its status line
            note = " ".join(part for part in (note, shared, lacking) if part)
        return self.decoder, note
