"""One process of the two-process save test (`tests/test_distributed.py`).

    python tests/_two_process_writes_worker.py PORT PROCESS_ID NUM_PROCESSES OUT_DIR SAVES

Every process alternates, `SAVES` times, an asynchronous `state_store.Writer` save into
`OUT_DIR/ck` and a synchronous `state_store.save` into a fresh `OUT_DIR/m<i>`, as a run
writes its checkpoint and then its models. Process 0's orbax threads are made late (each
background barrier starts 0.5 s after it is asked for), as a loaded machine makes them: a
save started beside another's background thread meets the same orbax barrier name there.
"""

from __future__ import annotations

import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

LATE_S = 0.5


def late_background_barriers(pid: int) -> None:
    """Delay process `pid == 0`'s orbax value barriers called off the main thread."""
    from orbax.checkpoint._src.futures import synchronization

    cls = synchronization.MultihostSynchronizedValue
    original = cls.set

    def late(self, value):  # type: ignore[no-untyped-def]
        if pid == 0 and threading.current_thread() is not threading.main_thread():
            time.sleep(LATE_S)
        return original(self, value)

    cls.set = late


def main(port: str, pid: int, count: int, out: str, saves: int) -> None:
    jax.distributed.initialize(f"localhost:{port}", count, pid)
    print(f"process {pid}: devices {jax.device_count()} local {jax.local_device_count()}")
    from pfedwn_jax import state_store

    late_background_barriers(pid)
    mesh = Mesh(np.array(jax.devices()), ("d",))
    tree = {"x": jax.device_put(jnp.ones((4, 1000)), NamedSharding(mesh, P("d")))}
    with state_store.Writer(f"{out}/ck") as writer:
        for i in range(saves):
            writer.save(i, tree, {"i": i})
            state_store.save(f"{out}/m{i}", 0, tree, {"i": i})
    print(f"process {pid}: saved {saves}")


if __name__ == "__main__":
    port, pid, count, out, saves = sys.argv[1:6]
    main(port, int(pid), int(count), out, int(saves))
