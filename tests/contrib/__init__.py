"""Tests of leases.contrib (the folder mirrors the package)."""
