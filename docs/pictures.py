"""Draw the pictures of docs/cli.md into docs/images/, one of each kind zbopt makes: a Gantt chart, a
memory timeline, a comparison chart, a frontier, a building block and the HTML report with a hovered
op (the last one needs Chromium, its driver and Selenium; it is left alone, said, without them).

Run from the repository's root: .venv/bin/python docs/pictures.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from zbopt import compare, generate, simulate
from zbopt.interfaces.cli.inputs import run_config
from zbopt.planning.frontier import memory_frontier, parse_memory_limits
from zbopt.presentation.plot import plot_comparison, plot_frontier, plot_gantt, plot_memory
from zbopt.presentation.plot.block import plot_block
from zbopt.presentation.report import write_report
from zbopt.solvers.blocks import published_block

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "images"


def main() -> int:
    IMAGES.mkdir(parents=True, exist_ok=True)
    demo = run_config(str(ROOT / "examples" / "demo.yaml"), {}).problem
    v_shape = run_config(str(ROOT / "examples" / "v_placement.yaml"), {}).problem.replace(num_microbatches=16)
    plot_gantt(simulate(v_shape, generate("zb-v", v_shape)), IMAGES / "gantt.png")
    plot_memory(simulate(demo, generate("zb-h1", demo)), IMAGES / "memory.png")
    plot_comparison(compare(demo, optimal=True, time_limit=20), IMAGES / "comparison.png")
    plot_frontier(memory_frontier(demo, parse_memory_limits("1:8:1"), time_limit=20), IMAGES / "frontier.png")
    plot_block(published_block("v-min", v_shape), IMAGES / "block.png")
    written = ["gantt", "memory", "comparison", "frontier", "block"]
    if _report_screenshot(v_shape, IMAGES / "report.png"):
        written.append("report")
    print(f"written to {IMAGES}: {', '.join(name + '.png' for name in written)}")
    return 0


def _report_screenshot(problem, path: Path) -> bool:
    """The report of zb-v and v-min in headless Chromium, an op of zb-v hovered, as a PNG."""
    try:
        from selenium import webdriver
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait
    except ImportError:
        print("report.png left alone: needs selenium (pip install 'zbopt[dev]')", file=sys.stderr)
        return False
    if shutil.which("chromium") is None or shutil.which("chromedriver") is None:
        print("report.png left alone: needs chromium and chromium-driver", file=sys.stderr)
        return False
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1100,900",
                     "--hide-scrollbars"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(shutil.which("chromedriver")))
    try:
        with tempfile.TemporaryDirectory() as folder:
            report = write_report(Path(folder) / "report.html", compare(problem, ["zb-v", "v-min", "v-half"]))
            driver.get(report.as_uri())
            WebDriverWait(driver, 10).until(lambda d: d.execute_script("return document.body.dataset.shown"))
            canvas = driver.find_element(By.CSS_SELECTOR, 'section[data-schedule="zb-v"] canvas.gantt')
            driver.execute_script("arguments[0].scrollIntoView({block: 'end'})", canvas)
            width, height = canvas.size["width"], canvas.size["height"]
            # device 1's row, a third of the way in
            ActionChains(driver).move_to_element_with_offset(canvas, int(width / 3 - width / 2),
                                                             int(33 - height / 2)).perform()
            WebDriverWait(driver, 5).until(lambda d: d.find_element(By.CSS_SELECTOR, ".tip").is_displayed())
            driver.save_screenshot(str(path))
    finally:
        driver.quit()
    return True


if __name__ == "__main__":
    sys.exit(main())
