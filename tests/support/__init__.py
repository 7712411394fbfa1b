"""What tests (and benchmarks) build for themselves: random-weight models with a fixed seed
(`randmodel.py`) and server processes on free loopback ports (`procs.py`)."""
