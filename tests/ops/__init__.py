"""Tests of leases.ops (the folder mirrors the package)."""
