"""The HTML report in a real browser (headless Chromium driven by Selenium): it renders without
console errors, a row click shows its schedule, and hovering an op shows its details. Skipped, with
the reason, where Chromium, its driver or Selenium is missing (`.ci/run` installs them where the
machine allows). The screenshot goes to tests/artifacts/ for a person to look at."""

import shutil
from pathlib import Path

import pytest

from zbopt import Problem, compare
from zbopt.presentation.report import write_report

pytestmark = pytest.mark.browser
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install 'zbopt[dev]')")
if shutil.which("chromium") is None or shutil.which("chromedriver") is None:
    pytest.skip("needs Chromium and its driver (Debian: apt-get install chromium chromium-driver)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1300,1000"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    driver = webdriver.Chrome(options=options, service=service)
    yield driver
    driver.quit()


def test_report_renders_shows_a_schedule_and_its_op_on_hover(browser, tmp_path):
    """zb-v and V-Min at p = 4, m = 8: no console error; the first row's schedule is drawn on
    load; clicking V-Min's row shows V-Min's section alone; hovering over device 0 at the
    middle of its first op (F of microbatch 0, 0F0 at [0, 1]) shows that op's details."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    problem = Problem(num_devices=4, num_microbatches=8, chunks_per_device=2, placement="v", forward_times=1,
                      backward_times=1, weight_times=1)
    comparison = compare(problem, ["zb-v", "v-min"])
    path = write_report(tmp_path / "report.html", comparison)
    browser.get(path.as_uri())
    WebDriverWait(browser, 10).until(lambda driver: driver.execute_script("return document.body.dataset.shown"))
    assert browser.execute_script("return document.body.dataset.shown") == comparison.rows[0].name
    browser.find_element(By.CSS_SELECTOR, 'table.comparison tr[data-schedule="v-min"]').click()
    WebDriverWait(browser, 10).until(lambda driver: driver.execute_script("return document.body.dataset.shown")
                                     == "v-min")
    sections = browser.find_elements(By.CSS_SELECTOR, "section.schedule")
    assert [section.get_attribute("data-schedule") for section in sections if section.is_displayed()] == ["v-min"]
    canvas = browser.find_element(By.CSS_SELECTOR, 'section[data-schedule="v-min"] canvas.gantt')
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", canvas)
    width = canvas.size["width"]
    makespan = next(row.makespan for row in comparison.rows if row.name == "v-min")
    left, right = 70, width - 8  # the viewer's label column and right margin
    x = left + 0.5 / makespan * (right - left)  # the middle of [0, 1]
    ActionChains(browser).move_to_element_with_offset(canvas, int(x - width / 2),
                                                      int(11 - canvas.size["height"] / 2)).perform()
    tip = browser.find_element(By.CSS_SELECTOR, 'section[data-schedule="v-min"] .tip')
    WebDriverWait(browser, 5).until(lambda driver: tip.is_displayed())
    assert tip.text.startswith("0F0 · forward · stage 0 (chunk 0) · microbatch 0 · start 0 · end 1")
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "report_hover.png"))
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []


def test_hovering_a_copy_strip_shows_the_copy(browser, tmp_path):
    """serial-offload, p = 2, m = 4: device 0's first offload 0O0 runs on the device-to-host strip
    under the compute boxes (rows 15-17 px of the 22 px row); a hover there names it, and one on the
    compute band at the same moment does not."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from zbopt import Op, generate, simulate

    problem = Problem(num_devices=2, num_microbatches=4, weight_times=1, allow_offload=True, offload_times=0.5,
                      memory_limit=1)
    comparison = compare(problem, ["serial-offload"])
    path = write_report(tmp_path / "report.html", comparison)
    browser.get(path.as_uri())
    WebDriverWait(browser, 10).until(lambda driver: driver.execute_script("return document.body.dataset.shown"))
    canvas = browser.find_element(By.CSS_SELECTOR, "canvas.gantt")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", canvas)
    simulation = simulate(problem, generate("serial-offload", problem))
    begin, end = simulation.times_of(Op.from_str("0O0"))
    width, height = canvas.size["width"], canvas.size["height"]
    x = 70 + (begin + end) / 2 / simulation.makespan * (width - 70 - 8)
    tip = browser.find_element(By.CSS_SELECTOR, ".tip")
    for y, expected in ((16, "0O0 · offload"), (5, None)):
        ActionChains(browser).move_to_element_with_offset(canvas, int(x - width / 2), int(y - height / 2)).perform()
        if expected is None:
            WebDriverWait(browser, 5).until(lambda driver: not tip.is_displayed() or "0O0" not in tip.text)
        else:
            WebDriverWait(browser, 5).until(lambda driver: tip.is_displayed())
            assert tip.text.startswith(expected)
