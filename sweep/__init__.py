"""``sac-sweep``: seeds x hyperparameter grids of ``sac-train`` as Ray Tune trials, each an ordinary run dir.

May import ``sac_edge.common`` and ``sac_edge.train``; nothing else imports this package. Ray, pyarrow (Ray's
storage layer) and scipy (the ``sac-edge[sweep]`` extra) are imported only here, and only once ``sac-sweep`` runs.
"""
