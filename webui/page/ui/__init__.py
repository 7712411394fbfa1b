"""The page as Gradio builds it: the layout, part by part (sidebar, chat panel, settings, the
Account, Admin and Server tabs), its look, and the JavaScript it runs in the browser."""
