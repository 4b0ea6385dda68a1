"""The core every layer shares: a model as a flat vector, perturbations, torch.distributed helpers, registries, seeds, the one error type."""
