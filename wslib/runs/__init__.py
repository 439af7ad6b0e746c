"""Reproducibility machinery (no algorithm): model zoo, run cache, results files, workers, statistics."""
