"""The models a server can serve: the short names and their cards, which models to serve and how
(`--model`, a `--models` file), a model's weights in bytes before it loads, loading an mlx-lm
folder, and a llama-family GGUF file converted into one. No threads of its own: loading runs
in the engine thread (core/engine), the rest wherever it is asked. docs/DESIGN.md maps it.
"""
