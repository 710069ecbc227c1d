"""Writes (issue 29, items 9-12): a failed write names its file and leaves the old one whole; an
output path is checked before any work and is never one of the inputs; devices are written in place."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from zbopt.core.errors import ZboptError
from zbopt.interfaces.cli import main
from zbopt.io.write import write_file

ROOT = Path(__file__).resolve().parent.parent
OLD = b"the old file, which a failed write must leave as it was\n" * 8
FILE_SIZE_LIMIT = 1000  # bytes: under every output below, over nothing Python writes on its own
SMALL = ["-s", "4", "-b", "32"]
# one command per kind of file, each writing more than FILE_SIZE_LIMIT
WRITES = {
    "export.json": ["export", *SMALL, "--schedule", "1f1b", "-o", "{}"],
    "export.trace.json": ["export", *SMALL, "--schedule", "1f1b", "-o", "{}"],
    "export.csv": ["export", *SMALL, "--schedule", "1f1b", "-o", "{}"],
    "megatron.json": ["export", *SMALL, "--schedule", "1f1b", "--format", "megatron", "-o", "{}"],
    "report.html": ["compare", *SMALL, "--schedule", "1f1b", "gpipe", "-o", "{}"],
    "compare.trace.json": ["compare", *SMALL, "--schedule", "1f1b", "gpipe", "-o", "{}"],
    "gantt.png": ["simulate", *SMALL, "--schedule", "1f1b", "-o", "{}"],
    "gantt.svg": ["simulate", *SMALL, "--schedule", "1f1b", "-o", "{}"],
    "chart.pdf": ["compare", *SMALL, "--schedule", "1f1b", "gpipe", "-o", "{}"],
    "solved.json": ["solve", "-s", "4", "-b", "16", "--time-limit", "3", "--export", "{}", "--quiet"],
}
# runs every command of WRITES in one process under a file-size limit, SIGXFSZ ignored (so a write
# past the limit fails with EFBIG instead of killing the process), each one's status (or what it
# raised) and stderr
UNDER_LIMIT = """
import contextlib, io, json, resource, signal, sys
import matplotlib.pyplot, ortools.sat.python.cp_model  # their caches and imports before the limit
from zbopt.interfaces.cli import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))
results = {}
for name, argv in json.loads(sys.argv[2]).items():
    with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(io.StringIO()):
        try:
            results[name] = [main(argv), err.getvalue()]
        except BaseException as error:  # a traceback: shown in that command's test
            results[name] = [repr(error), err.getvalue()]
print(json.dumps(results))
"""


def run(capsys, *argv) -> tuple[int, str, str]:
    status = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture(scope="module")
def under_limit(tmp_path_factory) -> tuple[Path, dict]:
    """Every kind of file written over an old one under a file-size limit: the folder and each
    command's [status, stderr]."""
    folder = tmp_path_factory.mktemp("limited")
    for name in WRITES:
        (folder / name).write_bytes(OLD)
    cases = {name: [token.format(folder / name) for token in argv] for name, argv in WRITES.items()}
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", UNDER_LIMIT, str(FILE_SIZE_LIMIT), json.dumps(cases)],
                          capture_output=True, text=True, env=environment, cwd=folder, timeout=300)
    assert done.returncode == 0, done.stderr
    return folder, json.loads(done.stdout)


@pytest.mark.parametrize("name", list(WRITES))
def test_a_write_that_fails_names_its_file_and_leaves_the_old_one_whole(under_limit, name):
    """Item 10: past the file-size limit, one line naming the file, exit 2, the old file byte for
    byte, and no temporary file left beside it."""
    folder, results = under_limit
    status, err = results[name]
    assert (status, err) == (2, f"zbopt: '{folder / name}': cannot write (File too large)\n")
    assert (folder / name).read_bytes() == OLD
    assert sorted(path.name for path in folder.iterdir()) == sorted(WRITES)


def test_the_same_commands_write_without_the_limit(tmp_path, capsys):
    """The control: each kind of file is written whole, over the old one, when the disk allows."""
    for name, argv in WRITES.items():
        if name == "solved.json":
            continue  # a solve takes seconds; solve --export is written in test_cli and test_torch_format
        target = tmp_path / name
        target.write_bytes(OLD)
        status, _, err = run(capsys, *[token.format(target) for token in argv])
        assert (status, err) == (0, ""), name
        assert target.stat().st_size > FILE_SIZE_LIMIT and target.read_bytes()[: len(OLD)] != OLD


def test_a_full_device_is_named(capsys):
    """Item 9: -o /dev/full said `zbopt: : No space left on device`."""
    status, out, err = run(capsys, "export", "--schedule", "1f1b", "--format", "json", "-o", "/dev/full")
    assert (status, out, err) == (2, "", "zbopt: '/dev/full': cannot write (No space left on device)\n")


def test_dev_null_is_written_in_place_and_stays_a_device(capsys):
    """A device is written as `open` writes it, never replaced by a file (as root, a rename would)."""
    status, out, err = run(capsys, "export", "--schedule", "1f1b", "--format", "json", "-o", "/dev/null")
    assert (status, out, err) == (0, "zbopt schedule JSON written to /dev/null\n", "")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_fifo_is_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    write_file(fifo, "through the pipe\n")
    assert reader.communicate(timeout=30)[0] == b"through the pipe\n"
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_an_old_file_keeps_its_permissions_and_a_link_its_target(tmp_path):
    """The replacement keeps the old file's permission bits; through a symbolic link, the file it
    names is replaced and the link stays a link."""
    target = tmp_path / "kept.json"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_file(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_a_new_file_gets_the_umask_s_permissions(tmp_path):
    old = os.umask(0o027)
    try:
        write_file(tmp_path / "new.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o640


def test_a_failure_while_writing_removes_the_temporary(tmp_path):
    """Anything raised by what writes the content (here an interrupt) leaves no temporary behind."""
    target = tmp_path / "figure.png"
    target.write_bytes(OLD)

    def interrupted(file):
        file.write(b"half a figure")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_file(target, interrupted)
    assert target.read_bytes() == OLD and [path.name for path in tmp_path.iterdir()] == ["figure.png"]


@pytest.mark.parametrize("command", [["export", "--schedule", "1f1b", "-o"], ["solve", "--time-limit", "1e6",
                                                                               "--export"]])
@pytest.mark.parametrize("spelling", ["cfg.json", "./sub/../cfg.json", "hard.json"])
def test_an_output_over_an_input_is_refused(tmp_path, capsys, monkeypatch, command, spelling):
    """Item 11: `export cfg.json -o cfg.json` and `solve cfg.json --export cfg.json` replaced the
    config with a schedule, exit 0; refused now however the path is spelled (a hard link too)."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "cfg.json"
    config.write_text('{"num_stages": 2, "num_microbatches": 4}\n')
    (tmp_path / "sub").mkdir()
    os.link(config, tmp_path / "hard.json")
    before = config.read_bytes()
    status, out, err = run(capsys, command[0], "cfg.json", *command[1:], spelling)
    flag = command[-1]
    assert (status, out) == (2, "")
    assert err == f"zbopt: {flag} '{spelling}': is the config file; writing it would replace it (give another file)\n"
    assert config.read_bytes() == before


def test_an_output_over_the_schedule_file_is_refused(tmp_path, capsys):
    schedule = tmp_path / "s.json"
    assert run(capsys, "export", "-s", 2, "-b", 4, "--schedule", "1f1b", "-o", schedule)[0] == 0
    before = schedule.read_bytes()
    status, _, err = run(capsys, "export", "--schedule-file", schedule, "-o", schedule)
    assert status == 2 and err.startswith(f"zbopt: -o '{schedule}': is the schedule file;")
    assert schedule.read_bytes() == before


@pytest.mark.parametrize(("export", "reason"), [
    ("/proc/x.json", "cannot create a file in '/proc' (No such file or directory)"),
    ("{tmp}/missing/x.json", "no such directory"),
    ("{tmp}", "is a directory"),
])
def test_an_unwritable_export_is_refused_before_solving(tmp_path, capsys, monkeypatch, export, reason):
    """Item 12: `solve --export /proc/x.json` solved, printed, then failed and lost the schedule."""
    import zbopt.solvers

    def no_solve(*args, **kwargs):
        raise AssertionError("solved before checking --export")

    monkeypatch.setattr(zbopt.solvers, "solve", no_solve)
    export, reason = export.format(tmp=tmp_path), reason.format(tmp=tmp_path)
    status, out, err = run(capsys, "solve", "-s", 2, "-b", 4, "--time-limit", "1e6", "--export", export)
    assert (status, out, err) == (2, "", f"zbopt: --export '{export}': {reason}\n")


def test_write_file_names_the_path_and_reason(tmp_path):
    with pytest.raises(ZboptError, match=r"^'.*/missing/x\.json': cannot write \(No such file or directory\)$"):
        write_file(tmp_path / "missing" / "x.json", "{}")


@pytest.mark.parametrize(("argv", "message"), [
    (["run-torch", "s.csv", "--trace", "t.txt"], "--trace 't.txt': unsupported extension, use .json (e.g. "
                                                 "run.trace.json)"),
    (["run-torch", "s.json", "--trace", "s.json"],
     "--trace 's.json': is the schedule; writing it would replace it (give another file)"),
    (["profile-torch", "s.csv", "-o", "costs.txt"], "-o 'costs.txt': unsupported extension, use .yaml, .yml, .json"),
    (["profile-torch", "s.json", "-o", "s.json"],
     "-o 's.json': is the schedule; writing it would replace it (give another file)"),
])
def test_the_torch_commands_check_their_outputs_first(tmp_path, capsys, monkeypatch, argv, message):
    """run-torch --trace and profile-torch -o: the extension known and not the schedule, before any rank starts
    (the schedule files here do not even exist, or are not CSVs: the output is checked first)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.json").write_text("not a CSV")
    assert run(capsys, *argv) == (2, "", f"zbopt: {message}\n")
    assert (tmp_path / "s.json").read_text() == "not a CSV"


def test_a_config_s_output_file_is_named_as_such(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(f"num_stages: 2\nnum_microbatches: 4\noutput_file: {tmp_path}/missing/g.png\n")
    assert run(capsys, "simulate", config) == (2, "", f"zbopt: output_file '{tmp_path}/missing/g.png': "
                                                      "no such directory\n")


def test_each_of_several_outputs_is_written(tmp_path, capsys):
    """Issue 40: `-o a.png -o b.svg` writes both (not the last one silently), for a chart command,
    for export (each file in its own format) and for compare (a report and a chart)."""
    flags = ["-s", "2", "-b", "4"]
    png, svg = tmp_path / "g.png", tmp_path / "g.svg"
    assert run(capsys, "simulate", *flags, "-o", png, "-o", svg)[0] == 0
    assert png.read_bytes().startswith(b"\x89PNG") and b"<svg" in svg.read_bytes()
    csv, saved = tmp_path / "s.csv", tmp_path / "s.json"
    assert run(capsys, "export", *flags, "-o", csv, "-o", saved)[0] == 0
    assert csv.read_text().splitlines()[0].startswith("0F0,") and json.loads(saved.read_text())["orders"]
    report, chart = tmp_path / "r.html", tmp_path / "c.png"
    assert run(capsys, "compare", *flags, "--schedule", "1f1b", "-o", report, "-o", chart)[0] == 0
    assert report.read_text().lstrip().lower().startswith("<!doctype html") and chart.stat().st_size > 0
    status, _, err = run(capsys, "simulate", *flags, "-o", png, "-o", png)
    assert status == 2 and "is the -o file" in err
