"""Budgets: power sensors (``sensors/``), memory probes, the once-a-second monitor and the governor.

Sensors are small readers that take a ``root: Path``, so tests run them on fixture trees laid out like a
Xavier NX's sysfs. May import ``sac_edge.common`` only (pynvml lazily, in ``sensors/nvml.py``).
"""
