"""The inference engine: one thread that owns the model and every MLX operation. Here the
engine itself and a request's way through it (intake, preparation, the prefix cache's glue,
emitting text, the output thread); its parts in rooms: `sched/` who runs and who waits,
`step/` one step of the model, `sample/` choosing tokens, `shard/` serving over an
mlx.launch group. What webui/ sees of it is core/seam. docs/DESIGN.md maps every module.
Importing this package loads no MLX: only the engine thread does, when it starts.
"""
