"""The contracts every stage shares, at the bottom of the layering: the error base and its codes
(``errors``), the trajectory data contract (``types``), the policy version (``versions``), and small helpers
with no agentrl dependency above them (``utils``)."""
