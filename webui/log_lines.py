"""radixchat's own log lines, as `serve` and `worker` write them to stderr: one line each, with
whatever a client sent in them made harmless.

A refused request's path, a model name, a user name or a field's value reaches a line as the
client wrote it; a control character there (ESC, CR, LF, NUL) could forge a second line or
drive the terminal of whoever reads the log. `OneLine` writes each as its escape (`\\x1b`,
`\\r`); a traceback after the line keeps its own line breaks. Runs in whichever thread logs.
"""

from __future__ import annotations

import logging
import re
import sys

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escaped(text: str) -> str:
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class OneLine(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escaped(record.message)
        return super().formatMessage(record)


def log_to_stderr() -> None:
    """radixchat's own log lines (a line per API request, models loaded and unloaded, what
    the caches forget) on stderr, from INFO up; other libraries keep their defaults."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLine("radixchat: %(message)s"))
    log = logging.getLogger("radixchat")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
