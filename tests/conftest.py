"""Test session: two CPU devices, so every engine and runner test also runs the slot sharding
(`engine.sharding`) the CLI uses on a multi-core machine. Must run before any JAX computation."""

from pfedwn_jax.devices import use_cpu_devices

use_cpu_devices(2)
