"""Run a torch.distributed.pipelining schedule for real, check its gradients, and profile its ops.

A schedule arrives as torch's "compute_only" CSV: row r lists rank r's actions in order, each
"{stage}{kind}{microbatch}" with kind F (forward), I (input-gradient backward), W (weight-gradient
backward) or B (full backward); an empty cell is an idle slot. zbopt.io.torch_order reads and
checks it and zbopt's simulator looks for a deadlock, before any rank starts (`check`). `run_torch`
(`launch`) starts one CPU process per rank (gloo over loopback), cuts a small MLP (`model`) into
the schedule's stages, runs the CSV with torch's own `_PipelineScheduleRuntime`, times every op
inside the ranks (`rank`), and checks every gradient against the same model trained in one
process (`run_report`). `profile_config` (`profile`) turns the measured times into a zbopt config, so
`zbopt solve` can optimize a schedule for the measured costs.

torch is imported inside the functions that need it, so `import zbopt` works without it
(install the optional extra: pip install 'zbopt[torch]').
"""

from zbopt.interfaces.runtime.launch import run_torch
from zbopt.interfaces.runtime.model import ToyModel
from zbopt.interfaces.runtime.profile import profile_config, profile_torch, save_profile
from zbopt.interfaces.runtime.run_report import (
    ATOL,
    RTOL,
    OpTime,
    ParameterCheck,
    StageReport,
    TorchRunReport,
    compare_gradients,
    format_report,
)

__all__ = ["ATOL", "RTOL", "OpTime", "ParameterCheck", "StageReport", "TorchRunReport", "ToyModel",
           "compare_gradients", "format_report", "profile_config", "profile_torch", "run_torch", "save_profile"]
