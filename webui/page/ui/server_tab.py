"""The Server tab: the server's figures (webui/page/logic/dashboard.py), one's own usage beside
everyone's, and two plots of the last hour, refreshed while the tab is open.

Its components (`server_tab`) and its one handler (`ServerTabHandlers.refresh`, a part of the
page's handlers, webui/page/events/handlers.py); when it refreshes is webui/page/events/wiring.py's. The
refresh runs in Gradio's worker threads; no MLX.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import gradio as gr

from radixchat.webui.page.events.view import PageView, notices
from radixchat.webui.page.logic.dashboard import dashboard

if TYPE_CHECKING:
    from gradio.components import Component

REFRESH_S = 3.0  # the Server tab's refresh, while it is open


@dataclass
class ServerTab:
    summary: gr.Markdown
    usage: gr.Markdown
    requests_plot: gr.BarPlot
    ttft_plot: gr.ScatterPlot
    timer: gr.Timer  # active while the tab is open

    @property
    def figures(self) -> list[Component]:
        """What a refresh sets, in `refresh`'s order."""
        return [self.summary, self.usage, self.requests_plot, self.ttft_plot]


def server_tab() -> ServerTab:
    summary = gr.Markdown(elem_id="server-summary")
    usage = gr.Markdown(elem_id="your-usage")
    with gr.Row():
        requests_plot = gr.BarPlot(
            x="time",
            y="count",
            color="series",
            y_title="requests",
            label="Requests per minute (last hour)",
            elem_id="requests-plot",
        )
        ttft_plot = gr.ScatterPlot(
            x="time",
            y="ms",
            color="series",
            y_title="ms",
            label="Time to first token per minute (last hour)",
            elem_id="ttft-plot",
        )
    timer = gr.Timer(REFRESH_S, active=False)
    return ServerTab(summary, usage, requests_plot, ttft_plot, timer)


class ServerTabHandlers(PageView):
    """The Server tab's part of the page's handlers."""

    @notices(4)
    def refresh(self, request: gr.Request) -> tuple[str, str, gr.BarPlot, gr.ScatterPlot]:
        you = self.who(request)  # an open Server tab counts as being signed in
        d = dashboard(self.chat.engines, self.chat.store, self.presence, you=you)
        # both plots span the whole window their titles name, points or not
        return (
            d.summary,
            d.usage,
            gr.BarPlot(d.requests, x_lim=list(d.x_lim)),
            gr.ScatterPlot(d.ttft, x_lim=list(d.x_lim)),
        )
