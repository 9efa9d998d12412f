"""The one engine: a run is a sweep of one run.

`setup` (`experiment.setup`) builds each run on the host; `step.round_step` is one round;
`program.block_program` scans rounds, vmapped over runs, on a `("runs", "slots")` mesh;
`execute` is the driver (programs, blocks, progress, checkpoints, divergence, writers);
`api.run` and `api.sweep` are the two entry points.
"""
