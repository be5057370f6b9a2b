"""Tests of leases.store (the folder mirrors the package)."""
