"""Tests of leases.api (the folder mirrors the package)."""
