"""The page's events: which handler each component's event calls (`wiring`), and what the
handlers do over a browser session's view: loading, sending, syncing, accounts."""
