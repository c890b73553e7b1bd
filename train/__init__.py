"""``sac-train``: SAC on the server (networks, replay buffer, manual and autograd updates) -> a run dir.

May import ``sac_edge.common`` only; nothing on the device's inference path imports this package.
"""
