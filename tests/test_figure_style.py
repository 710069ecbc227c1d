"""The paper style: TrueType fonts in PDF (Type 3 is refused at submission), STIX text whose every
character is its own glyph, Computer Modern mathtext without TeX, colours told apart under simulated
colour-vision deficiencies, no title unless asked; the screen style untouched around it; `--style`
on the CLI and `compare -o` by extension."""

import itertools
import json
import re

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib import font_manager
from matplotlib.colors import to_rgb
from matplotlib.ft2font import FT2Font

from zbopt import Problem, compare, generate, simulate
from zbopt.interfaces.cli import main
from zbopt.planning.frontier import Frontier, FrontierPoint, HeuristicPoint
from zbopt.presentation.plot import (
    FIGURE_STYLES,
    PAPER_PALETTE,
    SCREEN_PALETTE,
    plot_comparison,
    plot_frontier,
    plot_gantt,
    plot_memory,
)
from zbopt.presentation.plot.block import plot_block
from zbopt.solvers.blocks import published_block

PROBLEM = Problem(num_devices=3, num_microbatches=4, forward_times=1, backward_times=1, weight_times=1,
                  memory_limit=3)
SIMULATION = simulate(PROBLEM, generate("zb-h1", PROBLEM))
FRONTIER = Frontier(problem=PROBLEM, time_limit=1.0, wall_time_s=0.0,
                    points=tuple(FrontierPoint(float(limit), "optimal", makespan, makespan, 0.0, float(limit))
                                 for limit, makespan in ((1, 30.0), (2, 16.0), (3, 14.0))),
                    heuristics=(HeuristicPoint("zb-h1", 3.0, 14.0),))
FIGURES = {"gantt": lambda **style: plot_gantt(SIMULATION, **style),
           "memory": lambda **style: plot_memory(SIMULATION, **style),
           "comparison": lambda **style: plot_comparison(compare(PROBLEM, ["zb-h1", "1f1b"]), **style),
           "frontier": lambda **style: plot_frontier(FRONTIER, **style)}


def pdf_fonts(path) -> tuple[set[str], set[str]]:
    """(font subtypes, base font names without the subset prefix) of a PDF."""
    data = path.read_bytes()
    subtypes = {name.decode() for name in re.findall(rb"/Subtype\s*/(\w+)", data)}
    return subtypes & {"Type1", "Type3", "TrueType", "Type0", "CIDFontType2"}, \
        {name.decode().split("+")[-1] for name in re.findall(rb"/BaseFont\s*/([\w+-]+)", data)}


@pytest.mark.parametrize("figure", FIGURES)
def test_paper_pdfs_embed_computer_modern_as_truetype_and_have_no_title(figure, tmp_path):
    FIGURES[figure](path=tmp_path / "paper.pdf", style="paper")
    FIGURES[figure](path=tmp_path / "screen.pdf")
    subtypes, fonts = pdf_fonts(tmp_path / "paper.pdf")
    assert "Type3" not in subtypes and "CIDFontType2" in subtypes and fonts == {"STIXGeneral-Regular"}
    assert "Type3" in pdf_fonts(tmp_path / "screen.pdf")[0]  # matplotlib's default, which the style changes
    figure_object = FIGURES[figure](style="paper")
    titles = [figure_object.get_suptitle(), *(axes.get_title() for axes in figure_object.axes)]
    assert not any(titles)
    asked = FIGURES[figure](style="paper", title="asked for")
    assert "asked for" in [asked.get_suptitle(), *(axes.get_title() for axes in asked.axes)]
    plt.close("all")


def test_the_block_drawing_takes_the_style_too(tmp_path):
    plot_block(published_block("zb-h1", PROBLEM), tmp_path / "block.pdf", style="paper")
    subtypes, fonts = pdf_fonts(tmp_path / "block.pdf")
    assert "Type3" not in subtypes and fonts == {"STIXGeneral-Regular"}


def test_mathtext_is_computer_modern_without_tex(tmp_path):
    plot_gantt(SIMULATION, tmp_path / "math.pdf", title=r"$T_F = \alpha$", style="paper")
    assert not matplotlib.rcParams["text.usetex"]
    _, fonts = pdf_fonts(tmp_path / "math.pdf")
    assert {"Cmmi10", "Cmr10"} <= fonts  # math italic for T, F and alpha; roman for '='
    assert "STIXGeneral-Regular" in fonts  # the text around it
    plot_gantt(SIMULATION, tmp_path / "screen.pdf", title=r"$T_F = \alpha$")
    assert not any(font.startswith("Cm") for font in pdf_fonts(tmp_path / "screen.pdf")[1])


# Adobe's glyph names of the punctuation a text font must not map elsewhere (matplotlib's cmr10 maps
# '>' to questiondown and '|' to endash: TeX's old encoding)
GLYPH_NAMES = {"<": "less", ">": "greater", "|": "bar", "_": "underscore", "{": "braceleft", "}": "braceright"}


@pytest.mark.parametrize("figure", FIGURES)
def test_every_character_a_paper_figure_writes_is_its_own_glyph(figure):
    drawn = FIGURES[figure](style="paper", title="p < q > r | s_t {u} …")
    with matplotlib.style.context(FIGURE_STYLES["paper"].sheet):
        font = FT2Font(font_manager.findfont(font_manager.FontProperties(family="serif")))
    texts = [text.get_text() for text in drawn.findobj(matplotlib.text.Text)]
    plt.close(drawn)
    characters = {character for text in texts for character in text if not character.isspace()}
    assert set(GLYPH_NAMES) <= characters
    assert not [c for c in characters if font.get_glyph_name(font.get_char_index(ord(c))) == ".notdef"]
    assert {c: font.get_glyph_name(font.get_char_index(ord(c))) for c in GLYPH_NAMES} == GLYPH_NAMES


def test_the_style_ends_with_the_plot():
    before = {key: matplotlib.rcParams[key] for key in ("pdf.fonttype", "font.family", "mathtext.fontset")}
    figure = plot_gantt(SIMULATION, style="paper")
    assert {key: matplotlib.rcParams[key] for key in before} == before
    colours = {to_rgb(collection.get_facecolor()[0]) for collection in figure.axes[0].collections
               if (collection.get_gid() or "").startswith("ops-")}
    assert colours == {to_rgb(PAPER_PALETTE.kinds[kind]) for kind in "FBW"}
    screen = plot_gantt(SIMULATION)
    assert {to_rgb(collection.get_facecolor()[0]) for collection in screen.axes[0].collections
            if (collection.get_gid() or "").startswith("ops-")} \
        == {to_rgb(SCREEN_PALETTE.kinds[kind]) for kind in "FBW"}
    plt.close("all")


# Machado, Oliveira and Fernandes (2009), severity 1, on linear sRGB
DEFICIENCIES = {
    "protanopia": [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]],
    "deuteranopia": [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.011820, 0.042940, 0.968881]],
    "tritanopia": [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602], [0.004733, 0.691367, 0.303900]],
}
TOLD_APART = 15.0  # CIE76 distance: well past a just-noticeable difference (about 2.3) for boxes side by side


def seen_with(deficiency, colour: str) -> np.ndarray:
    """The colour as seen with the deficiency, in CIELAB (D65)."""
    srgb = np.array(to_rgb(colour))
    linear = np.where(srgb <= 0.04045, srgb / 12.92, ((srgb + 0.055) / 1.055) ** 2.4)
    linear = np.clip(np.array(DEFICIENCIES[deficiency]) @ linear, 0, 1)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear
    xyz = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def closest_kinds(palette, deficiency) -> float:
    """The least distance between two op kinds' colours (a recompute shares F's, told apart by hatching)."""
    seen = {kind: seen_with(deficiency, colour) for kind, colour in palette.kinds.items() if kind != "R"}
    return min(float(np.linalg.norm(seen[a] - seen[b])) for a, b in itertools.combinations(seen, 2))


@pytest.mark.parametrize("deficiency", DEFICIENCIES)
def test_paper_colours_stay_apart_under_each_colour_vision_deficiency(deficiency):
    assert closest_kinds(PAPER_PALETTE, deficiency) > TOLD_APART


def test_the_screen_palette_would_not():
    """Why the paper style has a palette of its own: with deuteranopia the screen's B and L merge."""
    assert closest_kinds(SCREEN_PALETTE, "deuteranopia") < TOLD_APART / 5


@pytest.mark.parametrize(("argv", "culprit"), [
    (["simulate", "--schedule", "1f1b", "--style", "paper"], "--style paper: no figure"),
    (["simulate", "--schedule", "1f1b", "--style", "fancy", "-o", "{tmp}/x.png"], "figure style 'fancy'"),
    (["compare", "--style", "paper", "-o", "{tmp}/report.html"], "--style paper: the HTML report"),
    (["compare", "--style", "paper", "-o", "{tmp}/rows.trace.json"], "--style paper: no figure"),
    (["compare", "--style", "paper"], "--style paper: no figure"),
    (["frontier", "--memory-limits", "2:3:1", "--style", "paper"], "--style paper: no figure"),
    (["block", "--style", "paper", "--no-visualization", "-o", "{tmp}/x.png"], "--style paper: no figure"),
    (["solve", "--style", "paper"], "--style paper: no figure"),
    (["compare", "-o", "{tmp}/rows.txt"], "output file"),
    (["compare", "--frontier", "2:3:1", "-o", "{tmp}/rows.png"], "--frontier"),
])
def test_cli_style_and_output_mistakes_are_one_line_and_exit_2(argv, culprit, tmp_path, capsys):
    flags = ["--num-stages", "3", "--num-microbatches", "4", "-f", "1", "-bw", "1", "-w", "1"]
    assert main([token.format(tmp=tmp_path) for token in argv] + flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("zbopt: ") and culprit in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_compare_writes_its_chart_in_paper_style_and_its_rows_as_one_trace(tmp_path, capsys):
    flags = ["--num-stages", "3", "--num-microbatches", "4", "-f", "1", "-bw", "1", "-w", "1", "--quiet"]
    assert main(["compare", "--schedule", "1f1b", "zb-h1", "-o", str(tmp_path / "rows.pdf"), "--style", "paper",
                 *flags]) == 0
    assert "Type3" not in pdf_fonts(tmp_path / "rows.pdf")[0]
    assert main(["compare", "--schedule", "1f1b", "zb-h1", "-o", str(tmp_path / "rows.trace.json"), *flags]) == 0
    events = json.loads((tmp_path / "rows.trace.json").read_text())["traceEvents"]
    processes = {event["pid"]: event["args"]["name"] for event in events if event["name"] == "process_name"}
    # in the table's order: zb-h1, m(F+B+W) + (p-1)(F+B-W) = 14, before 1f1b, m(F+B+W) + (p-1)(F+B) = 16
    assert processes == {1: "zb-h1 · device 0", 2: "zb-h1 · device 1", 3: "zb-h1 · device 2",
                         4: "1f1b · device 0", 5: "1f1b · device 1", 6: "1f1b · device 2"}
    ends = {}
    for event in events:
        if event["ph"] == "X":
            ends[event["pid"]] = max(ends.get(event["pid"], 0), event["ts"] + event["dur"])
    scale = json.loads((tmp_path / "rows.trace.json").read_text())["otherData"]["ticks_per_unit"]
    assert max(ends[pid] for pid in (1, 2, 3)) == 14 * scale and max(ends[pid] for pid in (4, 5, 6)) == 16 * scale
    flows = [event["id"] for event in events if event["ph"] == "s"]
    assert len(flows) == len(set(flows)) == 2 * (2 * 2 * 4)  # per schedule: F and B cross 2 boundaries, 4 microbatches
    assert capsys.readouterr().out == ""
