"""The seam between the web layer and an engine: the protocol an engine answers, the requests
and events that cross it, the handle both sides hold, and the tool-call text formats both
sides read. Value types and pure Python only (no MLX, no threads of its own): webui/ may
import this room and never the engine's. docs/DESIGN.md maps it.
"""
