"""FL algorithms as registered data: ``get_algorithm(name)``, ``available_algorithms()``.

See ``pfedwn_jax.algorithms.base`` for the interface and its conventions. Importing this
package imports (and so registers) every built-in algorithm.
"""

import importlib

from pfedwn_jax.algorithms.base import (
    Algorithm,
    NoHParams,
    RoundContext,
    available_algorithms,
    get_algorithm,
    group_average_matrix,
    hparams_dict,
    init_clients,
    local_update,
    make_hparams,
    register,
)

# Algorithm modules register themselves on import; this order is the registration order,
# i.e. the default order of `pfedwn run` and of its table (the paper's Table II rows).
_BASELINES = ("local", "fedavg", "fedprox")
# --- personalised methods (engineer D edits this block) ---
_PERSONALISED: tuple[str, ...] = ("perfedavg", "fedamp", "pfedwn")
# --- end of personalised methods ---

for _module in _BASELINES + _PERSONALISED:
    importlib.import_module(f"pfedwn_jax.algorithms.{_module}")

__all__ = [
    "Algorithm",
    "NoHParams",
    "RoundContext",
    "available_algorithms",
    "get_algorithm",
    "group_average_matrix",
    "hparams_dict",
    "init_clients",
    "local_update",
    "make_hparams",
    "register",
]
