"""The Gradio chat page, in four rooms: `logic/` what the buttons do to the chats and replies,
without Gradio (testable alone; tests/test_packaging.py holds it to that), `ui/` the page's
parts, look and browser scripts, `events/` which event calls what and what each does, and
`routes/` what is served beside Gradio (a shared chat's page, the Content-Security-Policy,
the sign-in page's notices, a signed-out tab). Runs on the server's event loop and Gradio's
workers; no MLX. docs/DESIGN.md maps every module.
"""
