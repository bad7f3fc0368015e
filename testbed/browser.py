"""A real browser for the web view's test: Debian's Chromium, driven by Selenium through Debian's
chromium-driver (testbed/install-host-packages.sh installs both), headless, with no profile kept.

Nothing is downloaded: the browser and its driver are the machine's own, named by path, so
Selenium's driver manager has nothing to fetch.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def missing() -> str | None:
    """Why no browser can run here (a sentence naming what to install), or None."""
    absent = [path for path in (CHROMIUM, CHROMEDRIVER) if shutil.which(path) is None]
    if absent:
        missing_now = ", ".join(absent)
        return f"no {missing_now}: install chromium and chromium-driver (`make host-packages` as root)"
    return None


@contextlib.contextmanager
def chromium(width: int = 1400, height: int = 1100) -> Iterator[webdriver.Chrome]:
    """A headless Chromium with a throwaway profile, quit afterwards."""
    with tempfile.TemporaryDirectory(prefix="tessera-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for argument in (
            "--headless=new",
            "--no-sandbox",  # the test bed runs as root, where Chromium's sandbox refuses to start
            "--disable-dev-shm-usage",
            "--disable-gpu",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
        ):
            options.add_argument(argument)
        driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
        try:
            driver.set_page_load_timeout(60)
            yield driver
        finally:
            driver.quit()
