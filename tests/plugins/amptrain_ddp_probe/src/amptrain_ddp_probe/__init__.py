"""Test-only amptrain plugin for data-parallel tests."""
