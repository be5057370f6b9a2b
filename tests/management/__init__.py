"""Tests of leases.management (the folder mirrors the package)."""
