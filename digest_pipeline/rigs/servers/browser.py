"""Headless Debian Chromium, driven through its chromedriver by Selenium, reading the Dagster UI.

`headless_chromium` starts Chromium on a throwaway profile and always quits it; a `Page` waits
(bounded, never a fixed sleep) for what the UI renders, reads it and takes screenshots. The
Dagster pages' URLs and selectors live here too, so a test says what it reads, not how.
"""

import contextlib
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

from selenium import webdriver
from selenium.common.exceptions import (
    ElementClickInterceptedException,
    ElementNotInteractableException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

T = TypeVar("T")

#: Debian's chromedriver, where `chromium-driver` puts it (also found on PATH)
CHROMEDRIVER = Path("/usr/bin/chromedriver")
#: `--no-sandbox`: CI runs as root, where Chromium refuses its sandbox; the rest keep a headless
#: browser on a loaded 2-core box from GPU, /dev/shm and background-network work nobody reads
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--window-size=1600,1400",
)
#: how long a wait lasts by default: the webserver answers GraphQL slowly on a loaded machine
TIMEOUT = 60.0
#: how often a wait looks again
POLL = 0.25
#: what an element's look raises while the UI is still rendering it: look again
NOT_YET = (
    StaleElementReferenceException,
    ElementClickInterceptedException,
    ElementNotInteractableException,
)


def find_chromium() -> Path | None:
    """Debian's `chromium` launcher on PATH, or None."""
    found = shutil.which("chromium")
    return Path(found) if found else None


def find_chromedriver() -> Path | None:
    """Debian's `chromedriver` (PATH, then /usr/bin), or None."""
    found = shutil.which("chromedriver")
    if found:
        return Path(found)
    return CHROMEDRIVER if CHROMEDRIVER.is_file() else None


def xpath_literal(text: str) -> str:
    """`text` as an XPath 1.0 string literal (which has no escapes: quotes need `concat`)."""
    if "'" not in text:
        return f"'{text}'"
    if '"' not in text:
        return f'"{text}"'
    parts = text.split("'")
    return "concat(" + ', "\'", '.join(f"'{p}'" for p in parts) + ")"


class PageTimeout(AssertionError):
    """What a page was waited for did not show within the bound; a screenshot was saved."""


@dataclass
class Page:
    """One browser tab: open a URL, wait for elements by XPath, read them, save screenshots.

    Every wait is bounded by `timeout` seconds; one that runs out saves `timeout-N.png` (and the
    page's HTML) into `shots` and raises PageTimeout naming what it waited for. An element is
    found and read (or clicked) in one step, tried again whole when the UI re-rendered it in
    between, so no element handle outlives the look that found it.
    """

    driver: WebDriver
    shots: Path
    timeout: float = TIMEOUT
    _timeouts: int = field(default=0, repr=False)

    def open(self, url: str) -> None:
        """Loads `url` (a full page load: the UI starts afresh, with no cached query)."""
        self.driver.get(url)

    def wait_until(self, probe: Callable[[], T | None], what: str) -> T:
        """Calls `probe` until it returns something other than None; returns that."""
        deadline = time.monotonic() + self.timeout
        while True:
            # a re-render, or an overlay still fading out, is a reason to look again
            with contextlib.suppress(*NOT_YET):
                found = probe()
                if found is not None:
                    return found
            if time.monotonic() > deadline:
                raise self._timed_out(what)
            time.sleep(POLL)

    def read(self, xpath: str, reader: Callable[[WebElement], T]) -> T:
        """`reader` of the first displayed element at `xpath`, once there is one."""

        def probe() -> tuple[T] | None:
            for element in self.driver.find_elements(By.XPATH, xpath):
                if element.is_displayed():
                    return (reader(element),)
            return None

        return self.wait_until(probe, f"an element at {xpath}")[0]

    def read_all(self, xpath: str, reader: Callable[[WebElement], T]) -> list[T]:
        """`reader` of every element at `xpath`, once there is at least one."""

        def probe() -> list[T] | None:
            return [reader(e) for e in self.driver.find_elements(By.XPATH, xpath)] or None

        return self.wait_until(probe, f"elements at {xpath}")

    def wait_for(self, xpath: str) -> None:
        """Returns once an element at `xpath` is displayed."""
        self.read(xpath, lambda _: None)

    def click(self, xpath: str) -> None:
        """Clicks the element at `xpath` once it is displayed (and not covered)."""
        self.read(xpath, lambda e: e.click())

    def type_into(self, xpath: str, text: str) -> None:
        """Types `text` and then Tab (so the UI takes it) into the (empty) input at `xpath`."""
        self.read(xpath, lambda e: e.send_keys(text, Keys.TAB))

    def text(self, element: WebElement) -> str:
        """The element's text as rendered (`innerText`), stripped."""
        return str(self.driver.execute_script("return arguments[0].innerText;", element)).strip()

    def rows(self, table: WebElement) -> list[list[str]]:
        """The rendered text of each cell of each row of `table` (not of tables nested in it)."""
        rows = self.driver.execute_script(
            "return Array.from(arguments[0].rows, r => Array.from(r.cells, c => c.innerText));",
            table,
        )
        return [[str(cell).strip() for cell in row] for row in rows]

    def screenshot(self, name: str) -> Path:
        """Saves the viewport as `shots/<name>.png`; returns its path."""
        self.shots.mkdir(parents=True, exist_ok=True)
        path = self.shots / f"{name}.png"
        assert self.driver.save_screenshot(str(path)), f"no screenshot saved at {path}"
        return path

    def _timed_out(self, what: str) -> PageTimeout:
        self._timeouts += 1
        name = f"timeout-{self._timeouts}"
        try:
            shot = self.screenshot(name)
            (self.shots / f"{name}.html").write_text(self.driver.page_source, encoding="utf-8")
            note = f"; see {shot}"
        except WebDriverException as e:  # a browser that died cannot show why: say so
            note = f"; no screenshot ({e.msg})"
        return PageTimeout(f"{what} not shown within {self.timeout} s at {self.url}{note}")

    @property
    def url(self) -> str:
        return str(self.driver.current_url)


@contextlib.contextmanager
def headless_chromium(
    chromium: Path, chromedriver: Path, workdir: Path, *, timeout: float = TIMEOUT
) -> Iterator[Page]:
    """Starts Chromium headless on a fresh profile under `workdir`; always quits it afterwards.

    The driver's path is given, so Selenium Manager never looks for (or downloads) one.
    Screenshots go to `workdir/shots`, chromedriver's log to `workdir/chromedriver.log`.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={workdir / 'profile'}"):
        options.add_argument(flag)
    service = Service(str(chromedriver), log_output=str(workdir / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    try:
        driver.set_page_load_timeout(timeout)
        yield Page(driver, workdir / "shots", timeout)
    finally:
        driver.quit()


# The Dagster UI (dagster-webserver 1.13). Its CSS classes are hashed per build, so the selectors
# anchor on what a person reads: headings, button labels, titles and link targets.

#: the Metadata table of an asset event (a partition's latest materialisation, an event's detail)
METADATA_TABLE = (
    "//span[normalize-space()='Metadata']/following-sibling::div[1]//table[not(ancestor::table)]"
)
NO_METADATA = "//*[normalize-space()='No metadata entries']"
#: a check's own tab list (the asset page has a Partitions tab too)
CHECK_PARTITIONS_TAB = (
    "//*[@role='tablist'][.//*[@role='tab' and @id='execution-history']]"
    "//*[@role='tab' and @id='partitions']"
)
PARTITION_FILTER = "//input[starts-with(@placeholder, 'Filter by partition')]"
DIALOG = "//div[contains(@class, 'bp5-dialog')]"
RUN_HREF = re.compile(r"/runs/([0-9a-f-]{36})")


def asset_url(base: str, asset: str, view: str, partition: str | None = None) -> str:
    """An asset page: `/assets/<key>?view=<tab>&partition=<partition key>`."""
    url = f"{base}/assets/{quote(asset)}?view={view}"
    return url if partition is None else f"{url}&partition={quote(partition, safe='')}"


def run_url(base: str, run_id: str) -> str:
    """A run's page."""
    return f"{base}/runs/{run_id}"


def job_url(base: str, location: str, job: str) -> str:
    """A job's overview page."""
    return f"{base}/locations/{quote(location)}/jobs/{quote(job)}"


@dataclass(frozen=True)
class ShownEvent:
    """An asset event as a page shows it: its run, its heading line and its metadata."""

    run_id: str | None
    heading: str
    metadata: dict[str, str]


#: the Metadata table of the shown event, or the line that says it has none
METADATA = f"{METADATA_TABLE} | {NO_METADATA}"
#: a loading spinner inside an element (the UI components' Spinner)
SPINNER = ".//*[contains(@class, 'Spinner')]"
#: links to a run inside an element
RUN_LINKS = ".//a[contains(@href, '/runs/')]"


def _metadata(page: Page) -> dict[str, str]:
    """The label → value text of the shown event's Metadata table ({} for "No metadata entries").

    One Metadata heading per shown event: the first table is the newest event's.
    """

    def entries(found: WebElement) -> dict[str, str]:
        if found.tag_name != "table":
            return {}
        return {row[0]: row[1] for row in page.rows(found) if len(row) >= 2 and row[0]}

    return page.read(METADATA, entries)


def _run_id(element: WebElement) -> str | None:
    """The id of the first run `element` links to, or None."""
    for link in element.find_elements(By.XPATH, RUN_LINKS):
        if found := RUN_HREF.search(link.get_attribute("href") or ""):
            return found.group(1)
    return None


def read_partition(page: Page, base: str, asset: str, partition: str) -> ShownEvent:
    """The asset's Partitions tab with `partition` selected: its latest materialisation.

    Waits until the partition's detail is loaded, then reads its "Run" field (None when never
    materialised) and its Metadata table (or "No metadata entries").
    """
    page.open(asset_url(base, asset, "partitions", partition))
    key = xpath_literal(partition)
    # the detail's heading (a list item holds the title directly): it shows a spinner beside the
    # key until the partition's events and status are loaded, and "None" fields meanwhile
    page.wait_for(f"//div[@data-tooltip={key}][span/div[@title={key}]][not({SPINNER})]")
    run_id = page.read(
        f"//div[span[normalize-space()='Run']][{RUN_LINKS} or normalize-space(text())='None']",
        _run_id,
    )
    return ShownEvent(run_id, partition, _metadata(page))


def read_latest_event(page: Page, base: str, asset: str, partition: str) -> ShownEvent:
    """The asset's Events tab for `partition`: the newest event's heading line and metadata.

    The heading reads "Partition <key> observed in run <id>" for an observation.
    """
    page.open(asset_url(base, asset, "events", partition))
    run_id, heading = page.read(
        "//*[starts-with(normalize-space(), 'Partition ') and contains(normalize-space(), ' in run ')]"
        "[not(.//*[starts-with(normalize-space(), 'Partition ')])]",
        lambda line: (_run_id(line), page.text(line)),
    )
    return ShownEvent(run_id, heading, _metadata(page))


def read_check_partition(page: Page, base: str, asset: str, check: str, partition: str) -> str:
    """A check's status for one partition, the tag its Partitions tab shows by the partition.

    "Passed", "Failed", "Execution failed", "Skipped", "In progress", or "No execution
    attempted".
    """
    page.open(f"{asset_url(base, asset, 'checks')}&checkDetail={quote(check)}")
    page.click(CHECK_PARTITIONS_TAB)
    # the list is virtualised: filter it down to the one partition, then select it
    page.type_into(PARTITION_FILTER, partition)
    key = xpath_literal(partition)
    page.click(f"//div[@data-tooltip={key}][div[@title={key}]]")
    return page.read(f"//span[div[@title={key}]]/following-sibling::*//*[@data-tooltip]", page.text)


def read_run_tags(page: Page, base: str, run_id: str, shot: str) -> dict[str, str]:
    """The run's tags as its "View tags and config" dialog lists them (`key: value`).

    Dagster's own tags are shown without their `dagster/` prefix. Saves the run's page as
    `<shot>.png` and the open dialog as `<shot>-tags.png`.
    """
    page.open(run_url(base, run_id))
    page.wait_for("//button[normalize-space()='View tags and config']")
    page.screenshot(shot)
    page.click("//button[normalize-space()='View tags and config']")
    shown = page.read_all(f"{DIALOG}//span[@data-tooltip]", page.text)
    page.screenshot(f"{shot}-tags")
    pairs = (text.partition(": ") for text in shown)
    return {key: value for key, sep, value in pairs if sep}


def launch_partition_by_clicking(
    page: Page, base: str, location: str, job: str, partition: str
) -> str:
    """Launches one partition as a person does: the job's page, "Materialize all…", the key.

    Types the key into the partition selection, clicks "Launch 1 run" and returns the run id
    the "Launched run" toast links to.
    """
    page.open(job_url(base, location, job))
    page.click("//button[normalize-space()='Materialize all…']")
    page.type_into(f"{DIALOG}//input[starts-with(@placeholder, 'ex:')]", partition)
    page.click(f"{DIALOG}//button[normalize-space()='Launch 1 run']")
    # the toast's "View" link goes to the new run
    run_id = page.read(
        "//*[a[contains(@href, '/runs/')]][*[starts-with(normalize-space(), 'Launched run')]]",
        _run_id,
    )
    assert run_id, "the launch toast links to no run"
    return run_id
