"""Debian's chromium, headless, driven through Selenium and Debian's chromium-driver (nothing downloads a
browser)."""

from __future__ import annotations

import shutil
from typing import Any


def make_browser(width: int = 1400, height: int = 1000) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert shutil.which("chromium") and shutil.which("chromedriver"), \
        "make setup installs Debian's chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or ""
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")), options=options)
