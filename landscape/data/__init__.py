"""Data sets (in memory, by name) and their split over clients (partitions, by name)."""

from landscape.data import builtin_sets, factories, leaf_sets, torchvision_sets  # noqa: F401 - imported to register them
from landscape.data.datasets import (
    DATASETS,
    ArrayDataset,
    DatasetBundle,
    dataset_option_defaults,
    load_dataset,
)
from landscape.data.partitions import (
    PARTITIONS,
    class_histogram,
    format_partition_table,
    make_partition,
    mean_label_entropy,
)

__all__ = [
    "DATASETS",
    "PARTITIONS",
    "ArrayDataset",
    "DatasetBundle",
    "class_histogram",
    "dataset_option_defaults",
    "format_partition_table",
    "load_dataset",
    "make_partition",
    "mean_label_entropy",
]
