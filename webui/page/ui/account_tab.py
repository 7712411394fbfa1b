"""The Account tab: one's own password and API keys.

`build` makes the tab's components and hooks their events to `AccountHandlers`
(webui/page/events/accounts_handlers.py), which does the work and decides who is asking; the tab's
place among the others is webui/page/ui/layout.py's. Built only when people sign in (with
--no-auth there is no account to manage). Runs while the page is built (the server's start);
its events run in Gradio's worker threads. No MLX.
"""

from __future__ import annotations

import gradio as gr

from radixchat.webui.page.events.accounts_handlers import KEY_HEADERS, AccountHandlers

# a new key is shown once, under the form: brought into view (on a laptop it was at the edge)
SHOW_KEY = """() => setTimeout(() => document.querySelector('#new-key')
  ?.scrollIntoView({block: 'center', behavior: 'instant'}), 50)"""


def build(handlers: AccountHandlers) -> gr.Tab:
    tab: gr.Tab  # what `with` gives: the tab itself (Gradio leaves __enter__ unannotated)
    with gr.Tab("Account", id="account", elem_id="account-tab") as tab:
        gr.Markdown("### Password")
        current = gr.Textbox(label="Current password", type="password", elem_id="current-password")
        new = gr.Textbox(label="New password (at least 8 characters)", type="password", elem_id="new-password")
        again = gr.Textbox(label="New password again", type="password", elem_id="new-password-again")
        change = gr.Button("Change password", elem_id="change-password", variant="primary")
        done = gr.Markdown(elem_id="password-changed")
        # the sign-in ended with the change: /logout lands on the sign-in page, in this tab
        sign_in_again = gr.Button(
            "Sign in again", link="logout", link_target="_self", visible=False, elem_id="sign-in-again"
        )

        gr.Markdown("### API keys\nFor the OpenAI-compatible API (`Authorization: Bearer <key>`).")
        with gr.Row(equal_height=True):
            label = gr.Textbox(label="New key's name", placeholder="laptop", elem_id="key-name", scale=3)
            create = gr.Button("Create key", elem_id="create-key", scale=1)
        secret = gr.Textbox(
            label="Your new key: copy it now, it is shown this once",
            interactive=False,
            visible=False,
            buttons=["copy"],
            elem_id="new-key",
        )
        table = gr.Dataframe(headers=KEY_HEADERS, interactive=False, elem_id="key-list", label="Your keys")
        with gr.Row(equal_height=True):
            pick = gr.Dropdown(label="Key to revoke", choices=[], elem_id="key-pick", scale=3)
            revoke = gr.Button("Revoke key", variant="stop", elem_id="revoke-key", scale=1)

    tab.select(handlers.account_shown, outputs=[table, pick])
    change.click(
        handlers.change_password, inputs=[current, new, again], outputs=[current, new, again, done, sign_in_again]
    )
    for made in (create.click, label.submit):
        made(handlers.create_key, inputs=[label], outputs=[secret, table, pick, label]).then(None, js=SHOW_KEY)
    revoke.click(handlers.revoke_key, inputs=[pick], outputs=[table, pick, secret])
    return tab
