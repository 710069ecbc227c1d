"""The planning floor: many schedules and solves on one problem, and a model turned into a plan.

`comparison` (the rows of `zbopt compare`), `frontier` (memory against makespan), `packing` (what the
microbatches' packing and order gain), `model/` (a model in real units) and `planner/` (a model's
split and schedule, certified). Nothing is imported here: each loads on its own.
"""
