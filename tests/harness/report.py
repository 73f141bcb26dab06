"""pytest plugin object: which tests ran rank processes at which world size, printed after the tests.

Registered by tests/conftest.py and by tests/upstream_compat/plugin.py (a session of its own); kept out of
tests/harness/pool.py so that the rank processes, which import the harness, never import pytest for it.
"""

import pytest

from tests.harness import world


class WorldSizeReport:

    def __init__(self, choice):
        self._choice = choice  # callable returning the session's WorldChoice
        self.tally = world.RunTally()

    def skip(self, item, reason):
        """Skip ``item`` for want of ranks, and count it as such."""
        self.tally.skipped_for_ranks(item.nodeid, reason)
        pytest.skip(reason)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item):
        world.take_runs()
        yield
        self.tally.ran(item.nodeid, world.take_runs())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = (yield).get_result()
        if report.when == "call" or report.outcome != "passed":
            self.tally.outcome(item.nodeid, report.outcome)

    def pytest_terminal_summary(self, terminalreporter):
        if self.tally.sizes or self.tally.short_of_ranks:
            for line in self.tally.lines(self._choice()):
                terminalreporter.write_line(line)
