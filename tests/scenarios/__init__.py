"""Scenario bodies: module-level functions run on every rank by tests.harness.RankPool (see tests/harness)."""
