"""The suite. Imported before its conftest, so what is set here holds for every module the
suite imports, in each xdist worker.

Compiled modules are kept, whatever PYTHONDONTWRITEBYTECODE says (some images set it):
without them every run compiles and assert-rewrites the project again in each worker, and
each server a slow test starts compiles it again (the fast tier, 2 cores: 73-74 s against
63-65 s with them kept). __pycache__/ is ignored by git.

And webui is imported before any test module imports gradio, so that gradio skips rewriting
its stubs in the workers too, as it does in a server (webui/gradio_import.py: ~1.1 s a process).
"""

import os
import sys

sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import radixchat.webui  # noqa: E402,F401  (after the lines above: it is compiled as they say)
