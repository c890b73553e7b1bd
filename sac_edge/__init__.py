"""sac-edge: train SAC policies on a server, deploy and fine-tune them on NVIDIA Jetson.

The pipeline stages live in top-level folders and import as ``sac_edge.<stage>``.
"""

__version__ = "0.1.0"
