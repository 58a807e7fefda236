"""A node for the tests: plays the kubelet for the pods the real operator creates in the API emulator.

Each pod runs as real processes (a venv stands in for each image: the test venv for the worker
image, the vLLM venv for its `-vllm-cpu` flavour where the node is given one) in its own network
namespace with its own IP on a bridge, its volumes bound at their mountPaths in a private mount
namespace, its env as a container would get it, cluster DNS in its /etc/hosts; its status (phase,
conditions, container states, exit codes, restart counts, podIP) is written back to the emulator.
See docs/testing-cluster.md.
"""

from tests.support.node_harness.netns import refused
from tests.support.node_harness.node import Node

__all__ = ["Node", "refused"]
