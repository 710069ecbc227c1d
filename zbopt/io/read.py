"""Reading what a user gives: the one path every file zbopt reads takes (a config's YAML or JSON,
a schedule's JSON, a torch CSV), and YAML text given on the command line; a config file's mapping
(`read_config_file`) and the Problem it describes (`load_problem`).

A file is refused, in one line naming it, when it is larger than MAX_FILE_BYTES (a YAML file,
MAX_YAML_BYTES), is not UTF-8 (the byte offset named), nests deeper than MAX_DEPTH, repeats a key
(the key and line named), or, in YAML, has aliases that repeat more than MAX_ALIAS_NODES nodes:
so that no file, however made, can hang zbopt, exhaust its memory or end in a traceback.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from pathlib import Path

import yaml

from zbopt.core.errors import ZboptError, shorten
from zbopt.core.problem import Problem
from zbopt.core.problem.config import problem_from_config
from zbopt.core.schedule import Schedule

__all__ = ["MAX_ALIAS_NODES", "MAX_DEPTH", "MAX_FILE_BYTES", "MAX_YAML_BYTES", "load_problem", "load_schedule",
           "parse_json", "parse_yaml", "read_config_file", "read_data", "read_text", "schedule_of"]

# A config is a few KB, a schedule JSON of 100k ops some 1.5 MB; 16 MiB is ten times the largest
# file zbopt writes for a documented workload, and reads in well under a second. YAML is read in
# pure Python (the only parser whose nesting can be counted before it recurses), some 0.4 MB a
# second: 1 MiB, far beyond any config, reads in about 3 s.
MAX_FILE_BYTES = 16 * 2**20
MAX_YAML_BYTES = 2**20
# A config nests 3 levels (overlap_times: {FBW: [..]}), a schedule JSON 3; 32 leaves room and stays
# far below Python's recursion limit (PyYAML's composer and json's decoder recurse once per level).
MAX_DEPTH = 32
# Aliases may reuse a list (`backward_times: *times`); a few hundred bytes of aliases to aliases
# expand to billions of nodes (the "billion laughs"), which every later step would walk.
MAX_ALIAS_NODES = 100_000
_MERGE_TAG = "tag:yaml.org,2002:merge"


def read_text(path: str | Path, what: str, most: int = MAX_FILE_BYTES) -> str:
    """The text of `path` (`what` names it in messages: "config file"), checked for size (at most
    `most` bytes) and UTF-8."""
    try:
        with open(path, "rb") as file:
            data = file.read(most + 1)
    except FileNotFoundError:
        raise ZboptError(f"{what} '{path}' not found") from None
    except OSError as error:
        raise ZboptError(f"{what} '{path}': {error.strerror}") from None
    if len(data) > most:
        raise ZboptError(f"{what} '{path}': larger than {most / 2**20:g} MiB, more than zbopt reads")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        found = shorten(data[error.start:error.start + 4])
        raise ZboptError(f"{what} '{path}': not UTF-8 text (byte {error.start}: {found})") from None


def read_data(path: str | Path, what: str) -> object:
    """The data of a YAML or JSON file (JSON when it ends in .json; YAML at most MAX_YAML_BYTES)."""
    where = f"{what} '{path}'"
    if Path(path).suffix.lower() == ".json":
        return parse_json(read_text(path, what), where)
    return parse_yaml(read_text(path, what, MAX_YAML_BYTES), where)


def read_config_file(path: str | Path) -> dict:
    """The key/value mapping of a YAML or JSON config file (JSON is read as YAML's subset unless
    the file ends in .json), read through this module's limits."""
    data = read_data(path, "config file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ZboptError(f"config file '{path}': expected a mapping of keys to values, got {type(data).__name__}")
    return data


def load_problem(path: str | Path) -> Problem:
    """The Problem a YAML or JSON config file describes, as `zbopt simulate CONFIG` reads it.

    Parameters
    ----------
    path : a config file: the same keys, aliases, batch keys and defaults as the command line
        (`output_file`, the command line's chart, is not the problem's and is passed over).

    Returns
    -------
    Problem

    Raises
    ------
    ZboptError : one line naming the file and the key for every mistake (an unknown key, a wrong
        value, a memory limit no schedule meets).

    Examples
    --------
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.yaml"
    >>> _ = path.write_text("num_stages: 2\\nnum_microbatches: 4\\nforward_times: 1\\n")
    >>> load_problem(path).describe()
    'p=2 devices, m=4 microbatches, v=1 chunk per device (loop placement), fused backward (F, BW)'
    """
    return problem_from_config(read_config_file(path), source=str(path), ignored=("output_file",))


def load_schedule(path: str | Path) -> tuple[Schedule, Problem | None]:
    """Read a schedule JSON written by `save_schedule`.

    Parameters
    ----------
    path : a JSON file of `save_schedule`'s form (a torch CSV goes through `zbopt.io.torch_order`).

    Returns
    -------
    (Schedule, Problem or None) : the schedule, and the problem when the file stores one.

    Raises
    ------
    ZboptError : for a file that is missing, too large, not UTF-8, not JSON, or not a schedule,
        naming the file and what is wrong.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from zbopt import Problem, generate, save_schedule
    >>> problem = Problem(num_devices=2, num_microbatches=4)
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "1f1b.json"
    >>> save_schedule(path, generate("1f1b", problem), problem)
    >>> schedule, stored = load_schedule(path)
    >>> schedule.name, stored == problem, schedule == generate("1f1b", problem)
    ('1f1b', True, True)
    """
    where = f"schedule file '{path}'"
    return schedule_of(parse_json(read_text(path, "schedule file"), where), where)


def schedule_of(data: object, where: str) -> tuple[Schedule, Problem | None]:
    """`load_schedule`'s answer from the file's data already read (errors prefixed by `where`)."""
    try:
        schedule = Schedule.from_dict(data)
        problem = Problem.from_dict(data["problem"]) if "problem" in data else None
    except ZboptError as error:
        raise ZboptError(f"{where}: {error}") from None
    return schedule, problem


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


# ----------------------------------------------------------------------------------- JSON
class _DuplicateKey(Exception):
    def __init__(self, key: str):
        self.key = key


def _unique_pairs(pairs: list) -> dict:
    data = dict(pairs)
    if len(data) != len(pairs):
        seen: set = set()
        raise _DuplicateKey(next(key for key, _ in pairs if key in seen or seen.add(key)))
    return data


def _json_depth(text: str) -> int:
    """How deep `text`'s arrays and objects nest, counted without recursion (strings skipped)."""
    brackets = re.sub(r'[^\[\]{}]+', "", re.sub(r'"[^"\\]*(?:\\.[^"\\]*)*"', "", text))
    return max(accumulate(1 if c in "[{" else -1 for c in brackets), default=0)


def parse_json(text: str, where: str) -> object:
    """JSON text as data; a duplicate key, deep nesting or a syntax error is one ZboptError line."""
    if _json_depth(text) > MAX_DEPTH:
        raise ZboptError(f"{where}: nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError as error:
        raise ZboptError(f"{where}: not valid JSON (line {error.lineno}: {error.msg})") from None
    except _DuplicateKey as duplicate:
        raise ZboptError(f"{where}: key {shorten(duplicate.key)} given twice{_json_key_line(text, duplicate.key)}"
                         ) from None


def _json_key_line(text: str, key: str) -> str:
    """", line N": where `key` is written a second time (as a key) in `text`, for the message."""
    written = re.escape(json.dumps(key))
    starts = [match.start() for match in re.finditer(written + r"\s*:", text)]
    return f", line {text.count(chr(10), 0, starts[1]) + 1}" if len(starts) > 1 else ""


# ----------------------------------------------------------------------------------- YAML
class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing deep nesting (before it recurses), duplicate keys and
    aliases that repeat more than MAX_ALIAS_NODES nodes."""

    def __init__(self, text: str):
        super().__init__(text)
        self.depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise yaml.YAMLError(f"line {self.peek_event().start_mark.line + 1}: nested deeper than "
                                 f"{MAX_DEPTH} levels")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, (str, int, float, bool)) or key is None:
                    if key in seen:
                        raise yaml.YAMLError(f"line {key_node.start_mark.line + 1}: key {shorten(key)} given twice")
                    seen.add(key)
        return super().construct_mapping(node, deep)


# YAML 1.2 reads 1e9 as a number, as JSON does; PyYAML's YAML 1.1 wants a dot (1.0e9), else a string.
_EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))


def _repeated_nodes(root: yaml.Node) -> int:
    """How many nodes the aliases in `root` add when expanded (each node's size is counted once)."""
    sizes: dict[int, int] = {}
    order, stack = [], [root]
    while stack:  # children before parents, without recursion
        node = stack.pop()
        if id(node) in sizes:
            continue
        sizes[id(node)] = 0
        order.append(node)
        stack.extend(_children(node))
    for node in reversed(order):
        sizes[id(node)] = 1 + sum(sizes[id(child)] for child in _children(node))
    return sizes[id(root)] - len(order)


def _children(node: yaml.Node) -> list:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [child for pair in node.value for child in pair]
    return []


def parse_yaml(text: str, where: str) -> object:
    """YAML text as data (safe tags only); every refusal or syntax error is one ZboptError line."""
    loader = None
    try:
        loader = _Loader(text)
        root = loader.get_single_node()
        if root is None:
            return None
        repeated = _repeated_nodes(root)
        if repeated > MAX_ALIAS_NODES:
            raise ZboptError(f"{where}: its aliases repeat {repeated:,} nodes (at most {MAX_ALIAS_NODES:,})")
        return loader.construct_document(root)
    except yaml.MarkedYAMLError as error:
        line = f"line {error.problem_mark.line + 1}: " if error.problem_mark is not None else ""
        raise ZboptError(f"{where}: not valid YAML ({line}{_one_line(error.problem or error.context)})") from None
    except yaml.reader.ReaderError as error:
        code = error.character if isinstance(error.character, int) else ord(error.character)
        raise ZboptError(f"{where}: not valid YAML (character {error.position}: #x{code:04x}, "
                         f"{_one_line(error.reason)})") from None
    except yaml.YAMLError as error:
        raise ZboptError(f"{where}: not valid YAML ({_one_line(error)})") from None
    finally:
        if loader is not None:
            loader.dispose()
