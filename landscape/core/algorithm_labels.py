"""The display label of every registered algorithm (FedSAM, FedNSAM, ...), in a module that imports nothing.

The algorithm registry (``landscape.train.algorithms``) gives each class it registers its label from here (an
algorithm of a user's module without one is labelled by its name); figures read the labels from here without
importing torch or training code. tests/train/test_algorithm_contract.py checks that every algorithm the package
registers has its label here.
"""

from __future__ import annotations

ALGORITHM_LABELS = {
    "fedavg": "FedAvg", "fedprox": "FedProx", "scaffold": "SCAFFOLD", "fedsam": "FedSAM",
    "fedasam": "FedASAM", "mofedsam": "MoFedSAM", "fedgamma": "FedGAMMA", "fedsmoo": "FedSMOO",
    "fedlesam": "FedLESAM", "fednsam": "FedNSAM", "fednsam-code": "FedNSAM (code)", "fedvssam": "FedVSSAM",
    "fedacg": "FedACG", "dynsam": "DynSAM",
}


def algorithm_label(name: str) -> str:
    """The display label of algorithm ``name``; the name itself for one without a label (a user's own)."""
    return ALGORITHM_LABELS.get(name, name)
