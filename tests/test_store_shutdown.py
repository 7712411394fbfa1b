"""Closing the store while the engine thread still queues metrics: nothing is lost silently."""

from __future__ import annotations

import threading

from radixchat.core.store import RequestRecord, Store
from tests.support.cheap import cheap_scrypt


def test_a_record_queued_while_the_store_closes_is_written_or_counted(tmp_path):
    store = Store(tmp_path / "s.db", scrypt=cheap_scrypt())
    store.record_request_async(RequestRecord(model="m", prompt_tokens=1))  # starts the writer
    assert store.flush()
    real = store._queue
    closer = threading.Thread(target=store.close)

    class CloseMidPut:
        """The queue of the writer, where `close` runs between _enqueue's check and its put."""

        def put_nowait(self, item):
            if isinstance(item, RequestRecord) and item.prompt_tokens == 2:
                closer.start()
                closer.join(0.5)  # give close every chance to finish first
            real.put_nowait(item)

        def __getattr__(self, name):
            return getattr(real, name)

    store._queue = CloseMidPut()
    store.record_request_async(RequestRecord(model="m", prompt_tokens=2))
    closer.join(30)
    assert not closer.is_alive()
    reopened = Store(tmp_path / "s.db", scrypt=cheap_scrypt())
    with reopened._tx(write=False) as db:
        written = db.execute("SELECT count(*) FROM requests WHERE prompt_tokens = 2").fetchone()[0]
    reopened.close()
    assert written + store.dropped == 1, (written, store.dropped)
