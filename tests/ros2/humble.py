"""``sac-edge`` as it runs on ROS 2 Humble's rclpy, emulated on the ROS venv's Kilted: the lifecycle node's
``__change_state`` is Humble 3.3.15's (ros2/rclpy humble branch, rclpy/lifecycle/node.py: an invalid
transition raises out of the service callback, rclpy#1209) and ``rclpy.wait_for_message`` is hidden (it came
to Humble with rclpy 3.3.14). ``humble.py ARGS...`` runs ``sac-edge ARGS...``."""

from __future__ import annotations

import sys

from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.lifecycle.node import LifecycleNodeMixin, LifecycleState

sys.modules["rclpy.wait_for_message"] = None  # type: ignore[assignment]  # import fails, as before 3.3.14


def _humble_change_state(self, transition_id: int) -> TransitionCallbackReturn:  # type: ignore[no-untyped-def]
    """Humble 3.3.15's ``LifecycleNodeMixin.__change_state``, verbatim but for the name-mangled calls."""
    self._LifecycleNodeMixin__check_is_initialized()
    initial_state = self._state_machine.current_state
    initial_state = LifecycleState(state_id=initial_state[0], label=initial_state[1])
    self._state_machine.trigger_transition_by_id(transition_id, True)

    cb_return_code = self._LifecycleNodeMixin__execute_callback(self._state_machine.current_state[0], initial_state)
    self._state_machine.trigger_transition_by_label(cb_return_code.to_label(), True)

    if cb_return_code == TransitionCallbackReturn.ERROR:
        # Now we're in the errorprocessing state, trigger the on_error callback
        # and transition again based on the return code.
        error_cb_ret_code = self._LifecycleNodeMixin__execute_callback(
            self._state_machine.current_state[0], initial_state
        )
        self._state_machine.trigger_transition_by_label(error_cb_ret_code.to_label(), True)
    return cb_return_code


assert _rclpy.RCLError  # what Humble's transition raises
LifecycleNodeMixin._LifecycleNodeMixin__change_state = _humble_change_state  # type: ignore[attr-defined]

if __name__ == "__main__":
    from sac_edge.edge_runtime.cli import main

    sys.exit(main(sys.argv[1:]))
