"""Tests of leases.pods (the folder mirrors the package)."""
