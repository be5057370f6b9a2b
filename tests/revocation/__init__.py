"""Tests of leases.revocation (the folder mirrors the package)."""
