"""FL algorithms as registered data: ``get_algorithm(name)``, ``available_algorithms()``.

See ``pfedwn_jax.algorithms.base`` for the interface and its conventions and
``pfedwn_jax.algorithms.common`` for the shared building blocks. Importing this package
imports (and so registers) every built-in algorithm.
"""

import importlib

from pfedwn_jax.algorithms.base import (
    FAMILIES,
    Algorithm,
    NoHParams,
    RoundContext,
    available_algorithms,
    checked,
    default_algorithms,
    dense_adjacency,
    dynamic_fields,
    family_representatives,
    get_algorithm,
    hparam_leaves,
    hparams,
    hparams_dict,
    make_hparams,
    neighbor_lists,
    register,
    static,
    static_hparams,
    unregister,
)
from pfedwn_jax.algorithms.common import (
    BaselineState,
    eval_own,
    group_average_matrix,
    group_average_weights,
    init_baseline,
    init_clients,
    local_update,
    neighbor_models,
    train_loss_record,
)

# Algorithm modules register themselves on import; this order is the registration order,
# i.e. the default order of `pfedwn run` and of its table (the paper's Table II rows):
# the baselines, then the personalised methods.
_BUILTIN: tuple[str, ...] = ("local", "fedavg", "fedprox", "perfedavg", "fedamp", "pfedwn")
# The field's further methods (not run by default), after the paper's six.
_BUILTIN += ("ditto", "scaffold", "server_opt", "feddyn", "fednova", "apfl", "pfedme", "fedem")
_BUILTIN += ("splitting", "fedrod", "fedfomo", "moon", "fedala", "apple")
_BUILTIN += ("dpsgd", "pushsum", "dfedavgm", "choco", "cfa", "ifca", "cfl", "dispfl")

for _module in _BUILTIN:
    importlib.import_module(f"pfedwn_jax.algorithms.{_module}")

__all__ = [
    "FAMILIES",
    "Algorithm",
    "BaselineState",
    "NoHParams",
    "RoundContext",
    "available_algorithms",
    "checked",
    "default_algorithms",
    "dense_adjacency",
    "dynamic_fields",
    "eval_own",
    "family_representatives",
    "get_algorithm",
    "group_average_matrix",
    "group_average_weights",
    "hparam_leaves",
    "hparams",
    "hparams_dict",
    "init_baseline",
    "init_clients",
    "local_update",
    "make_hparams",
    "neighbor_lists",
    "neighbor_models",
    "register",
    "static",
    "static_hparams",
    "train_loss_record",
    "unregister",
]
