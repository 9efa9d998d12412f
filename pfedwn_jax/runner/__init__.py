"""The one engine's driver: a run is a sweep of one run.

`job.run_job` sets every run up on the host (`experiment.setup`) and runs them as one job;
`step.round_step` is one round (with the traced link model, `links`); `program.block_program`
scans rounds, vmapped over runs, on a `("runs", "slots")` mesh; `execute` is the driver
(programs, blocks, progress, checkpoints, divergence, writers); `options.Options` says how a
job runs. The front door over it is `pfedwn_jax.api` (`run`, `sweep`).
"""
