"""Schedule events: a scheduled function invoked at its rate (or every HOTLEDGER_LOCAL_SCHEDULE_RATE_S seconds)."""

from __future__ import annotations

import logging
import threading

from infra.localrt import events, template
from infra.localrt.handlers import load_handler

log = logging.getLogger("localrt")


class Scheduler(threading.Thread):
    def __init__(self, fn: template.Function, every_s: float, stop: threading.Event):
        super().__init__(name=f"schedule-{fn.name}", daemon=True)
        self.fn, self.every_s, self.stop_event = fn, every_s, stop
        # handler modules are imported one after another in the main thread: Powertools Loggers of one
        # service created by threads at once can leave the shared logger without a formatter for good
        self.handler = load_handler(fn)

    def run(self):
        while not self.stop_event.wait(self.every_s):
            try:
                self.handler(events.scheduled(), events.LambdaContext(self.fn.name, self.fn.timeout_s))
            except Exception:
                log.exception("scheduled function %s failed", self.fn.name)
