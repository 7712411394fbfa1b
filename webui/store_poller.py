"""A thread that reads the store every few seconds: the shape RemovalWatch (webui/removals.py)
and LiveRequests (webui/live_requests.py) share.

A subclass says what one look at the store does (`poll`) and what it is called in the log
(`WHAT`); this owns the thread, its loop (a busy or closing store is tried again at the next
look, anything else is logged and looked at again too) and `stop`. The thread is the
subclass's to start (`_thread.start()`), at once or when there is something to watch; `stop`
from whoever started it.
"""

from __future__ import annotations

import logging
import threading

from radixchat.core.store import StoreError

log = logging.getLogger("radixchat.poller")


class StorePoller:
    WHAT = "the store"  # what a failed look did not read, for the log

    def __init__(self, every_s: float, name: str):
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def poll(self) -> int:
        raise NotImplementedError

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            try:
                self.poll()
            except StoreError as e:  # a busy or closing store: the next look tries again
                log.warning("%s not read: %s", self.WHAT, e)
            except Exception:
                log.exception("%s not read", self.WHAT)
            if self._stop.wait(self.every_s):
                return
