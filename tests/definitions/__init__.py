"""Tests of leases.definitions (the folder mirrors the package)."""
