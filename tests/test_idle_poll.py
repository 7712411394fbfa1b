"""An idle server does not spin: the page's event queue looks for work every 10 ms, not every
1 ms as Gradio's does by default (which kept an idle server at ~4% of a core; the figure is
loadtests/bench_idle.py's). The attributes are Gradio's own, not public: if a Gradio upgrade
renames them, this fails and the idle cost is back."""

from __future__ import annotations

from radixchat.core.config import Settings
from radixchat.core.store import Store
from radixchat.webui.page.ui.layout import IDLE_POLL_S, IDLE_PROGRESS_POLL_S, build_page
from tests.support.fake_engine import FakeEngine


def test_the_pages_queue_polls_slowly_when_idle(tmp_path, tiny_model_dir):
    with Store(tmp_path / "idle.db") as store:
        page = build_page(FakeEngine(), Settings(model=str(tiny_model_dir)), store)
    assert page._queue.sleep_when_free == IDLE_POLL_S >= 0.01
    assert page._queue.progress_update_sleep_when_free == IDLE_PROGRESS_POLL_S
