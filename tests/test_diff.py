"""suzumio_diff on two real project stores: agents working at once interleave their messages
differently from run to run, which is no difference; what one agent sent, in its own order, is."""
from store_fixtures import at, config_of, expanded_agents, init_demo, make_config

import suzumio_coordination as coordination
import suzumio_diff


def two_runs(tmp_path):
    """Two projects of the same team: `demo` and `again`, both running."""
    root, first = init_demo(tmp_path / "root")
    config = make_config(name="again")
    second = root.init_project("again", config["task"], config, expanded_agents(config), "name: again\n",
                               "name: again\n")
    second.start()
    return root, first, second


def send(store, sender, body, recipient, step):
    coordination.send_message(store, config_of(store), sender, body, recipient=recipient,
                              source_agent=None if sender == "user" else sender, now=at(step))


def test_messages_of_agents_at_work_together_may_interleave_in_any_order(tmp_path):
    root, first, second = two_runs(tmp_path)
    try:
        for store, order in ((first, ["worker", "verifier"]), (second, ["verifier", "worker"])):
            send(store, "user", "Start.", "pm", 0)
            for step, sender in enumerate(order, start=1):
                send(store, sender, f"{sender} reports.", "pm", step)
        result = suzumio_diff.diff_projects(first, second)
        assert result["identical"], result["firstDifference"]
        assert list(result["sections"]["messages"]["a"]) == ["user", "verifier", "worker"]
    finally:
        root.close()


def test_what_one_agent_sent_differently_is_the_first_difference_with_that_agent_as_key(tmp_path):
    root, first, second = two_runs(tmp_path)
    try:
        for store, bodies in ((first, ["One.", "Two."]), (second, ["Two.", "One."])):
            for step, body in enumerate(bodies):
                send(store, "worker", body, "pm", step)
        result = suzumio_diff.diff_projects(first, second)
        assert not result["identical"]
        first_difference = result["firstDifference"]
        assert (first_difference["section"], first_difference["key"], first_difference["index"]) == (
            "messages", "worker", 0)
        assert first_difference["a"]["body"] == "One." and first_difference["b"]["body"] == "Two."
    finally:
        root.close()
