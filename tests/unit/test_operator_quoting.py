"""Words quoted from the API server, the kubelet or a worker keep the part that says why."""

from __future__ import annotations

from dverl_operator.objects import quoting


def test_a_servers_message_keeps_its_opening_on_one_line() -> None:
    said = 'pods "j-learner-0" is forbidden:\n  violates PodSecurity ' + "x" * 700
    cut = quoting.head(said, quoting.LONG)
    assert len(cut) == quoting.LONG and cut.endswith("…") and "\n" not in cut
    assert cut.startswith('pods "j-learner-0" is forbidden: violates PodSecurity')
    assert quoting.head("short\nmessage") == "short message"


def test_a_logs_tail_keeps_its_last_lines() -> None:
    log = "\n".join(f"starting {i}" for i in range(100)) + "\nValueError: data.train: no such file"
    cut = quoting.tail(log)
    assert len(cut) == quoting.SHORT and cut.startswith("…")
    assert cut.endswith("ValueError: data.train: no such file")
    assert quoting.tail("kept\nwhole") == "kept\nwhole"
