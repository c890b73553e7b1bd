"""Launch ``sac-edge ros2`` as a managed lifecycle node under a robot's namespace (ros2 launch sac_edge.launch.py).

launch_ros's LifecycleNode runs the ``sac-edge`` executable with ``ros2 BUNDLE`` as its arguments; the
parameters file is ``sac_edge.params.yaml`` (its ``/**:`` matches any name and namespace). Configure and
activate it with ``ros2 lifecycle set /robot1/sac_edge configure`` (then ``activate``), a lifecycle manager,
or ``autostart: true``.
"""

from launch import LaunchDescription
from launch_ros.actions import LifecycleNode

BUNDLE = "/opt/robot/bundles/arm"


def generate_launch_description() -> LaunchDescription:
    return LaunchDescription(
        [
            LifecycleNode(
                executable="sac-edge",
                arguments=["ros2", BUNDLE],
                name="sac_edge",
                namespace="robot1",
                parameters=["sac_edge.params.yaml"],
                output="screen",
            )
        ]
    )
