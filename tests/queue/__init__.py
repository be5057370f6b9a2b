"""Tests of leases.queue (the folder mirrors the package)."""
