"""From a model to a plan: the layer split and the schedule, optimized together and certified.

split: a split (layers per virtual stage) and the Problem it makes. rules: the named baselines.
split_model: CP-SAT over stage boundaries. certify: a bound on every split at once. search: the
plan itself. result: what it answers.
"""

from zbopt.planning.planner.result import OPTIMAL, Outcome, PipelinePlan, Plan, PlanRow
from zbopt.planning.planner.rules import RULES, split_by_rule
from zbopt.planning.planner.search import plan
from zbopt.planning.planner.split import Pipeline, check_stages, split_problem, stage_names

__all__ = ["OPTIMAL", "RULES", "Outcome", "Pipeline", "PipelinePlan", "Plan", "PlanRow", "check_stages", "plan",
           "split_by_rule", "split_problem", "stage_names"]
