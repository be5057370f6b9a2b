"""Tests of leases.engine (the folder mirrors the package)."""
