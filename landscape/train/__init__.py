"""Training: the federated round loop and the algorithms it runs."""
