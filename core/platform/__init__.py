"""The machine under the engine: which BLAS runs the CPU's matmuls (`blas.py`, including the
OpenBLAS re-exec) and `radixchat doctor`'s report (`doctor.py`). Runs in the CLI's thread,
before the engine starts."""
