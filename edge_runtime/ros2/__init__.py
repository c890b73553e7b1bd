"""The ROS 2 side of the runtime, apart from the node that composes it (``edge_runtime/ros2_node.py``): the
system's rclpy imported once with one line on Foxy (``compat.py``), QoS from parameters with warnings on
incompatible peers (``qos.py``), ``/diagnostics`` (``diagnostics.py``), MCAP recording (``recorder.py``) and
input ages (``inputs.py``).

rclpy and the message packages come from the robot's own ROS 2 (Humble and newer) and are imported lazily:
never a pip dependency of the device runtime. This package imports ``common`` only (no other package, nor the
composition root).
"""
