import pytest


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    # each phase's report on the test item, so that a fixture can see whether the test failed
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
