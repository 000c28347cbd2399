"""The SWE environment: fix bugs in Python repositories inside Docker sandboxes, graded by hidden tests.

Tasks use the SWE-bench row format (`SweTask`); 30+ tasks over small bundled repositories ship with the
package (built by ``python -m agentrl.envs.swe.build_tasks``). See docs/swe.md.
"""

from agentrl.envs.swe.config import SweConfig
from agentrl.envs.swe.env import SweEnv
from agentrl.envs.swe.task import SweTask, load_jsonl

__all__ = ["SweConfig", "SweEnv", "SweTask", "load_jsonl"]
