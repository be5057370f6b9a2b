"""Tests of leases.telemetry (the folder mirrors the package)."""
