"""Prints the largest relative error each check saw, after the summary."""

import harness


def pytest_terminal_summary(terminalreporter):
    if not harness.max_errors:
        return
    terminalreporter.section(
        "largest error per check, max|plait - reference| / max|reference|")
    width = max(len(check) for check in harness.max_errors)
    for check, error in sorted(harness.max_errors.items()):
        terminalreporter.write_line(f"{check:<{width}}  {error:.2e}")
