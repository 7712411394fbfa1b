"""Who may come in: sign-in that can't be brute-forced or aimed at someone, its fair line in
front of password hashing, device cookies, the door of Gradio's /login, and the gate on the
page's own routes. Runs on the server's event loop and worker threads."""
