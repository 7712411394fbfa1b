"""The test harness: what tests (and benchmarks) build and drive for themselves, imported as
`tests.support.<module>` (no test module imports another, none edits sys.path; test_packaging
checks both).

Models: random-weight models with a fixed seed (`randmodel.py`), the same as GGUF files
(`ggufmodel.py`), an engine with no model behind the seam (`fake_engine.py`). Processes:
`radixchat serve` on free loopback ports (`procs.py` for the command, ports and load-test
servers; `server.py` for the tests' `Server`, with keys or with the page's users, and a
`Listener` elsewhere on loopback; `workers.py` for `radixchat worker`s and smg in front of them). Browsers: Debian's Chromium through Playwright
(`browser.py`) and the page as a user drives it there (`page.py`). Clients: the official
OpenAI client, a signed-in httpx client and Gradio's queue protocol (`clients.py`). Helpers:
many users' conversations on an engine (`conversations.py`), simulated radix-tree segments
(`segments.py`), a /metrics reader (`metrics.py`), a cheap password hash (`cheap.py`).
"""
