"""``agentrl bench peers``: agentrl beside another RL framework on the same work (see :mod:`.main`).

- :mod:`.settings`: the settings mapping, from one agentrl run config to the peer's names, and the list of
  differences the mapping cannot remove;
- :mod:`.install`: the peer in a directory of its own, never in agentrl's dependencies;
- :mod:`.trl_side`: TRL's run (a child process): the environment adapter, timing and the final model;
- :mod:`.run`: one seed, both frameworks, then one evaluation of every model;
- :mod:`.report`: the figures and the table.

To add a peer: a ``<peer>_side`` module that trains from a spec and writes the same result fields, its
settings mapping and differences in :mod:`.settings`, and its choice in :mod:`.main`.
"""
