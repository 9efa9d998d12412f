"""The paper's Tables II and III (maximum target test accuracy, %), as printed.

`PAPER_MAX[(case, dataset)][method]`; cases are named as `reproduce.learning` names its
settings ("Case 1".."Case 3" for Table II, "20 neighbors" for Table III).
"""

from __future__ import annotations

#: The paper's methods, in its tables' row order: the one list every study runs.
METHODS = ("local", "fedavg", "fedprox", "perfedavg", "fedamp", "pfedwn")
_DATASETS = ("MNIST", "CIFAR-10", "CIFAR-100")

# Table II: rows in METHODS order; columns Case 1-3 x (MNIST, CIFAR-10, CIFAR-100)
_TABLE2 = (
    (98.3, 98.3, 55.8, 98.4, 65.6, 52.3, 98.0, 61.9, 45.4),
    (88.0, 16.0, 35.0, 96.2, 31.3, 35.4, 88.5, 54.8, 30.2),
    (83.4, 19.2, 32.8, 94.3, 31.2, 36.1, 88.1, 56.2, 32.3),
    (92.0, 95.0, 38.2, 98.1, 40.6, 39.7, 90.8, 64.4, 32.2),
    (98.4, 98.3, 56.6, 98.3, 62.3, 51.6, 98.1, 64.9, 48.5),
    (98.4, 98.4, 57.2, 98.4, 68.8, 58.8, 98.1, 65.3, 50.2),
)
# Table III (20 neighbors, gamma_th 10): rows in METHODS order; MNIST, CIFAR-10, CIFAR-100
_TABLE3 = (
    (83.3, 53.2, 49.7),
    (86.1, 37.9, 42.1),
    (88.9, 32.5, 42.2),
    (88.9, 48.3, 42.7),
    (92.1, 58.1, 49.6),
    (90.0, 56.5, 50.8),
)


def _columns() -> dict[tuple[str, str], dict[str, float]]:
    out: dict[tuple[str, str], dict[str, float]] = {}
    for row, method in zip(_TABLE2, METHODS, strict=True):
        for j, value in enumerate(row):
            out.setdefault((f"Case {j // 3 + 1}", _DATASETS[j % 3]), {})[method] = value
    for values, method in zip(_TABLE3, METHODS, strict=True):
        for dataset, value in zip(_DATASETS, values, strict=True):
            out.setdefault(("20 neighbors", dataset), {})[method] = value
    return out


PAPER_MAX: dict[tuple[str, str], dict[str, float]] = _columns()
