"""Checking a bundle against a robot's recorded log (``sac-edge replay``) and beside the robot's controller
(the ROS 2 node's ``shadow`` mode): findings named by joint (docs/ROS2.md, "Before the robot moves").

- ``findings.py``: the ``Finding`` (kind, joints, detail) and the slot names a layout gives.
- ``online.py``: ``OnlineChecks``, the findings that need no future data (stale inputs, frozen channels,
  values out of the training range) and the per-joint divergence between the policy's commands and the
  robot's, fed one step at a time; the node's shadow mode and the offline replay feed the same object, so
  their figures are the same.
- ``analysis.py``: the findings that need the whole log (unit/scale errors from the kinematics, swapped
  joints and command signs from how each command channel moved the robot, which training slot each
  recorded channel resembles) and the per-joint action statistics.
- ``recording.py``: reading an MCAP file or a rosbag2 directory (the ``mcap`` and ``mcap-ros2-support``
  packages, no ROS needed).
- ``plot.py``: the PNG of ``--plot`` (matplotlib, imported lazily).

Running the policy over a log (the bundle's backends through ``Runtime``) is the composition root's
(``edge_runtime/replayer.py``). This package imports ``common`` only.
"""
