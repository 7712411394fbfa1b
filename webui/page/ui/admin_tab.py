"""The Admin tab: the users with their usage; add one, disable or re-enable, reset a password,
make an admin or no longer one (never the last), set a request limit.

`build` makes the tab (hidden) and hooks its events to `AccountHandlers`
(webui/page/events/accounts_handlers.py): the page's load shows it to admins only, and every one of
its handlers checks on the server that the signed-in user is an admin, so a hidden tab is no
part of the protection. The tab's place is webui/page/ui/layout.py's. A new user gets a generated
password, shown to the admin once. Runs while the page is built; its events run in Gradio's
worker threads. No MLX.
"""

from __future__ import annotations

import gradio as gr

from radixchat.webui.page.events.accounts_handlers import USER_HEADERS, AccountHandlers


def build(page: gr.Blocks, handlers: AccountHandlers) -> gr.Tab:
    tab: gr.Tab  # what `with` gives: the tab itself (Gradio leaves __enter__ unannotated)
    with gr.Tab("Admin", id="admin", visible=False, elem_id="admin-tab") as tab:
        table = gr.Dataframe(headers=USER_HEADERS, interactive=False, elem_id="user-list", label="Users")
        secret = gr.Textbox(interactive=False, visible=False, buttons=["copy"], elem_id="shown-password")

        gr.Markdown("### Add a user\nThey get a generated password, shown here once.")
        with gr.Row(equal_height=True):
            name = gr.Textbox(label="Name", elem_id="add-name", scale=3)
            make_admin = gr.Checkbox(label="Admin", elem_id="add-admin", scale=1)
            add = gr.Button("Add user", variant="primary", elem_id="add-user", scale=1)

        gr.Markdown(
            "### A user\nDisabling ends their sign-ins, stops their API keys and what they have running at once; "
            "re-enabling lets them in again. An admin manages the users here; the last admin stays one."
        )
        who = gr.Dropdown(label="User", choices=[], elem_id="user-pick")
        with gr.Row():
            disable = gr.Button("Disable", variant="stop", elem_id="disable-user")
            enable = gr.Button("Re-enable", elem_id="enable-user")
            reset = gr.Button("Reset password", elem_id="reset-password")
        with gr.Row():
            promote = gr.Button("Make admin", elem_id="make-admin")
            demote = gr.Button("Remove admin", elem_id="remove-admin")
        with gr.Row(equal_height=True):
            limit = gr.Number(
                label="Requests at once, waiting or running (empty or 0: the server's --max-user-requests)",
                precision=0,
                minimum=0,
                elem_id="user-limit",
                scale=3,
            )
            set_limit = gr.Button("Set limit", elem_id="set-limit", scale=1)

    page.load(handlers.admin_shown, outputs=[tab, table, who])
    tab.select(handlers.admin_shown, outputs=[tab, table, who])
    add.click(handlers.add_user, inputs=[name, make_admin], outputs=[secret, table, who, name, make_admin])
    for button, handler in (
        (disable, handlers.disable),
        (enable, handlers.enable),
        (reset, handlers.reset_password),
        (promote, handlers.make_admin),
        (demote, handlers.remove_admin),
    ):
        button.click(handler, inputs=[who], outputs=[table, who, secret])
    who.input(handlers.user_picked, inputs=[who], outputs=[limit])
    set_limit.click(handlers.set_limit, inputs=[who, limit], outputs=[table, who, secret])
    return tab
