"""The HTML report: one self-contained page whose table holds the comparison's exact numbers, with
exactly one Gantt chart and one memory chart per schedule, and nothing fetched from anywhere."""

import base64
import gzip
import json
import re
from collections import Counter
from html.parser import HTMLParser

import pytest

from zbopt import Op, Problem, compare, generate, simulate, solve
from zbopt.core.errors import ZboptError
from zbopt.interfaces.cli import main
from zbopt.presentation.report import render_report, write_report

PROBLEM = dict(num_devices=3, num_microbatches=4, forward_times=1, backward_times=2, weight_times=1, p2p_time=0.5,
               memory_limit=3)
FLAGS = ("-s", "3", "-b", "4", "-f", "1", "-bw", "2", "-w", "1", "--p2p-time", "0.5", "--memory-limit", "3")


class Page(HTMLParser):
    """What the tests read from a report: figures, section ids, table cells, links, raw tags."""

    def __init__(self, text: str):
        super().__init__()
        self.figures: list[tuple[str, str | None]] = []  # (class, data-schedule)
        self.svgs_in_figures = 0
        self.canvases_in_figures = 0
        self.script_sources: list[str | None] = []  # each <script>'s src (None: inline)
        self.data: dict[str, str] = {}  # schedule -> its embedded data, as written
        self._section: str | None = None
        self._in_data = False
        self.ids: list[str] = []
        self.links: list[str] = []
        self.tags: Counter = Counter()
        self.table: list[tuple[str, dict[str, tuple[str | None, str]]]] = []  # (schedule, key -> (data-value, text))
        self._depth_in_figure = 0
        self._cell: dict | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags[tag] += 1
        if "id" in attrs and tag == "section":
            self.ids.append(attrs["id"])
        if tag == "a" and "href" in attrs:
            self.links.append(attrs["href"])
        if tag == "figure":
            self.figures.append((attrs["class"], attrs.get("data-schedule")))
            self._depth_in_figure += 1
        if tag == "svg" and self._depth_in_figure:
            self.svgs_in_figures += 1
        if tag == "canvas" and self._depth_in_figure:
            self.canvases_in_figures += 1
        if tag == "section":
            self._section = attrs.get("data-schedule")
        if tag == "script":
            self.script_sources.append(attrs.get("src"))
            self._in_data = "schedule-data" in attrs.get("class", "")
            if self._in_data:
                self.data[self._section] = ""
        if tag == "tr" and "data-schedule" in attrs:
            self.table.append((attrs["data-schedule"], {}))
        if tag == "td" and "data-key" in attrs:
            self._cell = {"key": attrs["data-key"], "value": attrs.get("data-value"), "text": ""}

    def handle_endtag(self, tag):
        if tag == "figure":
            self._depth_in_figure -= 1
        if tag == "script":
            self._in_data = False
        if tag == "td" and self._cell is not None:
            self.table[-1][1][self._cell["key"]] = (self._cell["value"], self._cell["text"])
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data
        if self._in_data:
            self.data[self._section] += data


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    comparison = compare(Problem(**PROBLEM))
    path = write_report(tmp_path_factory.mktemp("report") / "report.html", comparison)
    text = path.read_text(encoding="utf-8")
    return comparison, text, Page(text)


def test_one_gantt_and_one_memory_chart_per_schedule_each_in_its_section(report):
    comparison, _, page = report
    names = [row.name for row in comparison.rows]
    assert len(names) > 5
    charts = Counter(page.figures)
    assert charts == Counter({("comparison", None): 1, **{("gantt", name): 1 for name in names},
                              **{("memory", name): 1 for name in names}})
    # the comparison chart is inline SVG; each schedule's charts a canvas the page draws from its data
    assert page.svgs_in_figures == 1 and page.canvases_in_figures == 2 * len(names)
    assert sorted(page.data) == sorted(names)
    # the table's names link to the sections, one section per schedule
    assert sorted(page.ids) == sorted(f"schedule-{name}" for name in names)
    assert page.links == [f"#schedule-{name}" for name in names]


def test_table_holds_the_comparisons_exact_numbers_in_its_order(report):
    comparison, _, page = report
    assert [name for name, _ in page.table] == [row.name for row in comparison.rows]
    for row, (_, cells) in zip(comparison.rows, page.table, strict=True):
        values, texts = row.to_dict(), row.cells()
        for key in ("makespan", "bubble_rate", "zb_bubble_rate", "peak_memory", "gap"):
            assert float(cells[key][0]) == values[key]
        assert {key: text for key, (_, text) in cells.items()} == texts


def test_report_refers_to_no_external_resource(report):
    _, text, page = report
    assert not page.tags["link"] and not page.tags["img"] and not page.tags["iframe"]
    assert page.script_sources and set(page.script_sources) == {None}  # inline scripts only
    assert not re.search(r"(?:src|href)\s*=\s*[\"']?\s*(?:[a-z]+:)?//", text, re.IGNORECASE)
    assert "@import" not in text and not re.search(r"url\(\s*[\"']?(?:[a-z]+:)?//", text, re.IGNORECASE)
    # the only URLs are SVG's namespace names, which nothing fetches
    urls = re.findall(r"(\S+?)=\"(https?://[^\"]*)\"", text)
    assert {attribute for attribute, _ in urls} <= {"xmlns", "xmlns:xlink"}
    assert len(urls) == len(re.findall(r"https?://", text))


def test_embedded_data_are_the_simulations_numbers(report):
    """Each schedule's data (gzip, base64) decode to its simulation: every op's device, start and
    end (from the first op's start), and the memory its device holds right after the op's own
    change: where the op alone changes its device's memory at that moment, the level of the
    simulator's memory step there, read off the steps here."""
    comparison, _, page = report
    for row in comparison.rows:
        data = json.loads(gzip.decompress(base64.b64decode(page.data[row.name])))
        simulation, table = row.simulation, row.simulation.table
        origin = float(simulation.start.min())
        ops = data["ops"]
        assert ops["name"] == [str(op) for op in table.ops()] and ops["d"] == list(table.device)
        assert ops["t0"] == pytest.approx([s - origin for s in simulation.start.tolist()], abs=1e-9)
        assert ops["t1"] == pytest.approx([e - origin for e in simulation.end.tolist()], abs=1e-9)
        moments = [simulation.start[i] if table.allocates_at_start[i] else simulation.end[i] for i in range(table.size)]
        alone = Counter((table.device[i], moments[i]) for i in range(table.size) if table.memory_delta[i])
        for index in range(table.size):
            times, levels = simulation.memory_steps[table.device[index]]
            if table.memory_delta[index] and alone[table.device[index], moments[index]] == 1:
                held = [level for time, level in zip(times, levels, strict=True) if time <= moments[index]][-1]
                assert ops["m"][index] == held
        assert data["makespan"] == simulation.makespan and data["devices"] == comparison.problem.num_devices


def test_memory_after_an_op_is_its_own_change_where_two_coincide():
    """serial-offload, p = 2, m = 4 (found by review): 0W0 ends at 7 as 0F1 starts; 0W0 leaves its
    device empty, 0F1 then holds one activation (the step at 7 shows only the latter)."""
    problem = Problem(num_devices=2, num_microbatches=4, weight_times=1, allow_offload=True, offload_times=0.5,
                      memory_limit=1)
    simulation = simulate(problem, generate("serial-offload", problem))
    table = simulation.table
    assert simulation.times_of(Op.from_str("0W0"))[1] == simulation.times_of(Op.from_str("0F1"))[0]
    assert simulation.memory_after[table.index(Op.from_str("0W0"))] == 0.0
    assert simulation.memory_after[table.index(Op.from_str("0F1"))] == 1.0


def test_report_path_must_be_html(tmp_path):
    comparison = compare(Problem(num_devices=2, num_microbatches=2), ["1f1b"])
    with pytest.raises(ZboptError, match=r"report file '.*report.svg': unsupported extension, use .html, .htm"):
        write_report(tmp_path / "report.svg", comparison)
    assert list(tmp_path.iterdir()) == []


def test_cli_writes_the_report_of_its_json_rows(tmp_path, capsys):
    path = tmp_path / "report.htm"
    status = main(["compare", *FLAGS, "--schedule", "1f1b", "zb-h1", "--json", "-o", str(path)])
    rows = json.loads(capsys.readouterr().out)
    page = Page(path.read_text(encoding="utf-8"))
    assert status == 0 and [name for name, _ in page.table] == [row["name"] for row in rows]
    assert sorted(row["name"] for row in rows) == ["1f1b", "zb-h1"] and rows[0]["makespan"] <= rows[1]["makespan"]
    for row, (_, cells) in zip(rows, page.table, strict=True):
        assert float(cells["makespan"][0]) == row["makespan"] and float(cells["gap"][0]) == row["gap"]
    assert Counter(kind for kind, _ in page.figures) == {"comparison": 1, "gantt": 2, "memory": 2}


def test_cli_report_with_a_frontier_holds_its_chart_and_prints_its_optima(tmp_path, capsys):
    path = tmp_path / "report.html"
    status = main(["compare", *FLAGS, "--schedule", "1f1b", "zb-h1", "--frontier", "2:3:1", "--time-limit", "10",
                   "-o", str(path)])
    out = capsys.readouterr().out
    page = Page(path.read_text(encoding="utf-8"))
    assert status == 0
    assert Counter(kind for kind, _ in page.figures) == {"comparison": 1, "frontier": 1, "gantt": 2, "memory": 2}
    for limit in (2, 3):
        optimum = solve(Problem(**PROBLEM).replace(memory_limit=limit), time_limit=10)
        assert optimum.status == "optimal"
        assert re.search(rf"^ +{limit}  optimal +{optimum.objective:.6g} ", out, re.M), out


def test_problem_table_writes_mappings_and_lists_as_people_do():
    problem = Problem(num_devices=2, num_microbatches=4, chunks_per_device=2, placement="v", forward_times=1,
                      backward_times=1, weight_times=1, overlap_times={"FB": 1.5, "FBW": [2, 2.5]},
                      memory_limit=[3, 4])
    page = render_report(compare(problem, ["zb-v"]))
    cells = dict(re.findall(r"<tr><th>([^<]+)</th><td>([^<]*)</td></tr>", page))
    assert cells["overlap_times"] == "FB: 1.5; FBW: 2, 2.5"
    assert cells["memory_limit"] == "3, 4"
    assert cells["iterations"] == "1"
