"""Tests of the insights app (Insights pages: access, shares)."""
