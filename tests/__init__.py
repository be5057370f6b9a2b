"""The test suite: one folder per leases package (tests/engine/ for leases/engine/, …); tests of
the top-level modules and of the whole system (smoke, chaos, checker, adoption, browser) sit here."""
