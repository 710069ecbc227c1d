"""The Problem's parameters as one table: every name, shape, default, config key, flag, unit, doc
and mechanism is written here once, and the constructor's keywords, the config keys, the CLI
flags, `Problem.to_dict` and the Parameters section of `Problem`'s docstring are read off it.

A new mechanism is one more group of rows here and one module that checks and expands its values
(see `zbopt.core.problem.mechanisms`).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from zbopt.core.problem.checks import boolean, nonnegative_number, positive_int, slowdown_factor

__all__ = ["ALWAYS_WRITTEN", "MECHANISMS", "PARAMETERS", "REQUIRED", "SHAPES", "Parameter", "config_keys",
           "docstring_section"]

REQUIRED = object()  # the default of a parameter every Problem must be given
# what one value of a parameter is: how a flag reads it and how `to_dict` writes it
SHAPES = ("count", "switch", "choice", "number", "per stage", "per device", "per microbatch", "pairs", "stored")
# the groups of `--help` and of the docstring, in order; "core" parameters are always written by `to_dict`,
# the others only where their mechanism is in use (some value of the group is not its default)
MECHANISMS = {
    "core": "the pipeline",
    "costs": "costs",
    "memory": "memory",
    "iterations": "iterations",
    "recomputation": "recomputation",
    "offload": "offload to host memory",
    "overlapped pairs": "overlapped pairs",
    "microbatch sizes": "microbatches that differ",
    "iteration ends": "the iteration's ends (data parallelism, FSDP, the optimizer step)",
}
ALWAYS_WRITTEN = ("core", "costs", "memory", "iterations")


@dataclass(frozen=True)
class Parameter:
    """One parameter of a Problem.

    name : the constructor's keyword and the attribute.
    shape : one of SHAPES.
    default : its value when not given (REQUIRED: it must be given).
    mechanism : its group, a key of MECHANISMS.
    help : one line: the flag's help and the first line of its docstring entry.
    details : more of its docstring entry (may be empty).
    keys : its config keys, the documented one first (default: its name).
    short : short flags (e.g. "-s"); flags: "--" + each key with dashes, unless `flag` is False.
    flag : whether the command line takes it (lists of lists and mappings make poor flags).
    unit : "time", "memory", "tokens" or "" (a count, a switch, a share).
    check : the check of its value alone (name, value) -> value, run first in table order; None
        where the check needs other values (the stage count, a mechanism's switch: `mechanisms`).
    """

    name: str
    shape: str
    default: object
    mechanism: str
    help: str
    details: str = ""
    keys: tuple[str, ...] = ()
    short: tuple[str, ...] = ()
    flag: bool = True
    unit: str = ""
    check: Callable[[str, object], object] | None = None

    @property
    def config_keys(self) -> tuple[str, ...]:
        return self.keys or (self.name,)

    @property
    def flags(self) -> tuple[str, ...]:
        """Its spellings on the command line, the documented one first; () without a flag."""
        if not self.flag:
            return ()
        return (*(f"--{key.replace('_', '-')}" for key in self.config_keys), *self.short)

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def doc_entry(self) -> str:
        """Its entry in the Parameters section: "name : help details", wrapped."""
        details = self.details[:1].upper() + self.details[1:]
        text = self.help if not self.details else \
            f"{self.help} {self.details}" if self.details.startswith("(") else f"{self.help}. {details}"
        return textwrap.fill(f"{self.name} : {text}", 100, subsequent_indent="    ")


_TIME = "per stage"
PARAMETERS: tuple[Parameter, ...] = (
    Parameter("num_devices", "count", REQUIRED, "core", "pipeline devices p",
              keys=("num_stages", "num_devices"), short=("-s",), check=positive_int),
    Parameter("num_microbatches", "count", REQUIRED, "core", "microbatches m per iteration",
              keys=("num_microbatches", "num_batches"), short=("-b",), check=positive_int),
    Parameter("chunks_per_device", "count", 1, "core", "model chunks v each device holds (S = p·v virtual stages)",
              short=("-v",), check=positive_int),
    Parameter("placement", "choice", "loop", "core", "stage placement: loop, v or bidirectional",
              "(`zbopt.core.placement.stage_device`). Bidirectional (DualPipe, Chimera; BitPipe with v = 4) needs an "
              "even v and one iteration: microbatches 0..ceil(m/2)-1 go down, through stages 0..S/2-1, the others "
              "up, through S/2..S-1 on the mirrored devices: stage S/2+s is the up copy of the model's stage s "
              "(give it the same costs). The second copy of the parameters is outside the memory model (it "
              "counts activations), and so is the exchange of the two copies' gradients after the step."),
    Parameter("forward_times", _TIME, 1.0, "costs", "F time, one value or one per virtual stage",
              "(or rows, one per virtual stage, of one value per microbatch: see microbatches that differ)",
              short=("-f",), unit="time"),
    Parameter("backward_times", _TIME, 2.0, "costs",
              "backward time: B when weight_times is given, else the fused BW", short=("-bw",), unit="time"),
    Parameter("weight_times", _TIME, None, "costs", "W time (splits the backward into B and W)",
              "None: a fused backward.", short=("-w",), unit="time"),
    Parameter("p2p_time", "number", 0.0, "costs", "latency between devices",
              "added to every dependency between ops on different devices.", unit="time", check=nonnegative_number),
    Parameter("activation_memory", _TIME, 1.0, "memory", "M_B per virtual stage",
              "allocated when F starts (ZB paper, Table 1).", unit="memory"),
    Parameter("weight_memory", _TIME, None, "memory", "M_W per virtual stage (split backward only; default half "
              "of M_B)", "the part of M_B that B keeps for W: B frees M_B - M_W when it ends, W frees M_W.",
              unit="memory"),
    Parameter("memory_limit", "per device", None, "memory", "memory cap per device (default none)",
              "one value for all devices or one per device.", unit="memory"),
    Parameter("iterations", "count", 1, "iterations", "optimizer steps back to back",
              "Microbatch j belongs to iteration j // m.", check=positive_int),
    Parameter("flush", "switch", True, "iterations", "iterations wait for each other's weight update (--no-flush: "
              "PipeDream-2BW's double-buffered weights)",
              "With a flush (default), stage s updates its weights between iterations, so its forwards of "
              "iteration k+1 wait for all its gradient ops (W or BW) of iteration k; --no-flush: PipeDream-2BW's "
              "double-buffered weights, whose second copy is not in the memory model.", check=boolean),
    Parameter("allow_recompute", "switch", False, "recomputation",
              "a schedule may recompute an activation instead of keeping it (needs checkpoint_memory)",
              "F then keeps only checkpoint_memory, and a recompute op R re-runs the forward before its "
              "backward, holding the whole activation again from its start.", check=boolean),
    Parameter("recompute_times", _TIME, None, "recomputation",
              "cost of a recompute R per virtual stage (default: the forward's)", unit="time"),
    Parameter("checkpoint_memory", _TIME, None, "recomputation",
              "what a recomputed activation keeps between F and R per virtual stage (its stage input)",
              "at most activation_memory; required with allow_recompute (it depends on the model).", unit="memory"),
    Parameter("allow_offload", "switch", False, "offload",
              "a schedule may offload an activation to host memory and reload it before its backward "
              "(needs offload_times)",
              "An offload O copies it out after its F on the device-to-host lane, freeing it when it ends; a "
              "reload L copies it back on the host-to-device lane, holding it again from its start, and ends "
              "before its backward. Copies run beside compute, one at a time per lane (Wan et al., ICML 2025).",
              check=boolean),
    Parameter("offload_times", _TIME, None, "offload", "device-to-host copy time of one activation per virtual stage",
              "required with allow_offload (it depends on the hardware).", unit="time"),
    Parameter("reload_times", _TIME, None, "offload",
              "host-to-device copy time of one activation per virtual stage (default: the offload time)", unit="time"),
    Parameter("shared_host_link", "switch", False, "offload",
              "devices 2k and 2k+1 share one host link, one copy each way at a time (PipeOffload's pairing)",
              check=boolean),
    Parameter("overlap_times", "pairs", None, "overlapped pairs",
              "what an overlapped pair costs, by pair kind, e.g. {FBW: 2.5}",
              "FB, a forward with an input-gradient B (split backward only), and FBW, a forward with a full "
              "backward; each a number or one per device. A schedule may run such a pair as one op of that cost, "
              "which starts once every member's input is ready and ends all of them. A kind not given cannot be "
              "used.", flag=False, unit="time"),
    Parameter("microbatch_tokens", "per microbatch", None, "microbatch sizes",
              "each microbatch's tokens (a packed one: its documents' lengths)",
              "its costs then follow the rule of `problem.microbatches` from the stage values, which are for "
              "reference_tokens.", flag=False, unit="tokens"),
    Parameter("attention_share", _TIME, None, "microbatch sizes",
              "share of F's and B's time that grows with the square of the length, per virtual stage"),
    Parameter("reference_tokens", "number", None, "microbatch sizes",
              "the length the per-stage costs are for (default: the mean of microbatch_tokens)", unit="tokens"),
    Parameter("microbatch_tables", "stored", None, "microbatch sizes",
              "the cost keys given as rows ((key, rows), ...), as stored", "Give forward_times, backward_times, "
              "weight_times or activation_memory (or recompute, offload and reload times) as rows instead.",
              flag=False),
    Parameter("sequence_slices", "count", 1, "microbatch sizes",
              "k > 1 splits each sequence into k slices (Seq1F1B), which are the microbatches",
              "m counts slices, microbatch_tokens sequences (`zbopt.core.problem.slices`, which checks it)."),
    Parameter("grad_reduce_times", _TIME, None, "iteration ends",
              "gradient reduction time per virtual stage (all-reduce or reduce-scatter over data parallelism)",
              "it runs on its device's communication stream, beside compute, once the stage's last gradient op (W "
              "or BW) has ended (torch's REDUCE_GRAD); the stream carries one transfer at a time, in the order they "
              "become ready.", unit="time"),
    Parameter("optimizer_step_times", "per device", None, "iteration ends", "optimizer step time per device",
              "it runs after the device's compute and its reductions; the iteration ends when every device's step "
              "has (`Simulation.iteration_time`, what the solvers minimise).", unit="time"),
    Parameter("unshard_times", _TIME, None, "iteration ends",
              "FSDP: all-gather time of a virtual stage's parameters, before its first forward",
              "the unshards run on the device's communication stream from time 0, chunk by chunk (torch's "
              "UNSHARD).", unit="time"),
    Parameter("unshard_memory", _TIME, None, "iteration ends",
              "FSDP: memory of a virtual stage's gathered parameters",
              "held from its unshard's start until the stage's last gradient op ends (RESHARD in zbopt's "
              "torch-comms-csv).",
              unit="memory"),
    Parameter("gradient_memory", _TIME, None, "iteration ends",
              "FSDP: memory of a virtual stage's unsharded gradients, accumulated over its microbatches until "
              "its reduction has ended",
              "held from the start of its first gradient op (W, or BW) of an iteration until its reduction ends "
              "(FSDP's reduce-scatter after the last backward; the shard left counts with the static memory, "
              "outside the model, as plain data parallelism's whole gradients do).", unit="memory"),
    Parameter("comm_slowdown", "number", 1.0, "iteration ends",
              "how many times slower compute runs while its device communicates (1: not at all)",
              "while a reduction, an unshard or a re-gather (G) of the device runs, its compute ops progress at "
              "1/comm_slowdown of their speed (the collectives' kernels share the device), e.g. 1.1 for 10% slower; "
              "a solver's model leaves it out (a relaxation: its answer is simulated with it, its bound still "
              "holds).", check=slowdown_factor),
    Parameter("allow_reshard", "switch", False, "iteration ends",
              "FSDP: a schedule may free a stage's gathered parameters after its last forward and gather them "
              "again (G) before its backwards (needs unshard_times)",
              "FSDP's reshard_after_forward, per stage and iteration: a G op (\"3G8\": stage 3, the iteration "
              "whose first microbatch is 8) listed after the stage's last forward runs on the device's all-gather "
              "lane for unshard_times; the stage's input gradients (and recomputes) wait for it, and its "
              "parameters are held from its start instead of from the last forward's end.", check=boolean),
)


def config_keys() -> dict[str, str]:
    """Config key (aliases included) -> parameter name; the stored-only keys are not config keys."""
    return {key: entry.name for entry in PARAMETERS if entry.shape != "stored" for key in entry.config_keys}


def docstring_section() -> str:
    """The Parameters section of `Problem`'s docstring, grouped by mechanism."""
    lines = ["Parameters", "----------"]
    for mechanism, title in MECHANISMS.items():
        rows = [entry for entry in PARAMETERS if entry.mechanism == mechanism]
        if rows:
            lines += [f"({title})", *(entry.doc_entry() for entry in rows)]
    return "\n".join(lines)
