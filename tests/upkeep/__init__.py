"""Tests of leases.upkeep (the folder mirrors the package)."""
