"""A model to plan for: ordered layers with their costs in real units (ms, GB), written out, read
from a measured profile, or counted from a transformer's shape and a device's FLOP/s.

`Model.from_config` reads a config's `model:` section, `load_model` a whole model file
({model, device}); `zbopt.planning.model.flops` states the formula behind every derived number.
"""

from zbopt.planning.model.architecture import Architecture
from zbopt.planning.model.flops import Training
from zbopt.planning.model.model import Model, load_model, model_files
from zbopt.planning.model.parts import Device, Layer
from zbopt.planning.model.presets import PRESETS

__all__ = ["PRESETS", "Architecture", "Device", "Layer", "Model", "Training", "load_model", "model_files"]
