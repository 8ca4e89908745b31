"""Offline dasc planning: horizons from decay weights, unit selection, layouts, TP placement, accounting."""
from trtllm_dasc.plan.plan import PLAN_VERSION, DascPlan, PlanOptions, build_plan, plan_from_path

__all__ = ["PLAN_VERSION", "DascPlan", "PlanOptions", "build_plan", "plan_from_path"]
