"""Engines on other machines: the seam as JSON, the worker that serves one in-process engine
over HTTP, and a front end's engines by URL, one worker each or several behind a router."""
