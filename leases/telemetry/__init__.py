"""Telemetry: what the engine counts and records, never what it decides by.

``metrics`` (the Prometheus series), ``multiprocess`` (prometheus_client's multiprocess
mode for workers and web processes) and ``history`` (the per-minute lease history recorder
behind Insights' charts).

Imports the store (``history``'s collection and booking entries) and the bottom modules only.
"""
