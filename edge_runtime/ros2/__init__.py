"""``sac-edge ros2``: the bundle's policy as a ROS 2 lifecycle node (``node.py``: ``SacEdgeNode`` and ``main``), a
client of the runtime as ``sac-edge run`` is, in parts: the parameters' schema (``parameters.py``), the robot's
inputs with JointState merged by joint name (``inputs.py``), the command publishers and the safe command
(``outputs.py``), one step (``step.py``), what configure builds and cleanup drops (``configured.py``), the
system's rclpy imported once with one line on Foxy (``compat.py``), QoS from parameters with warnings on
incompatible peers (``qos.py``), ``/diagnostics`` in every state (``diagnostics.py``), the step counts
(``status.py``) and MCAP recording (``recorder.py``).

rclpy and the message packages come from the robot's own ROS 2 (Humble and newer) and are imported lazily:
never a pip dependency of the device runtime (only ``node.py`` imports rclpy at its top: import it where ROS 2
is sourced). This package imports ``common``, the composition root (``Runtime``, its config) and ``control``.
"""
