"""The ``calc`` environment: arithmetic word problems solved with a safe ``calculate`` tool."""

from agentrl.envs.calc.env import CalcEnv
from agentrl.envs.calc.evaluator import CalcError, safe_eval
from agentrl.envs.calc.tasks import make_tasks

__all__ = ["CalcEnv", "CalcError", "make_tasks", "safe_eval"]
