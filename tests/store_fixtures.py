"""Fixtures for store tests: a real runtime root with an initialized `demo` project (docs/design/store.md)."""
import copy
from datetime import timedelta

import suzumio_config
import suzumio_store as st
from suzumio_records import format_ts, parse_ts

T0 = "2026-06-02T09:00:00.000Z"

BASE_CONFIG = {
    "name": "demo",
    "task": "Build the demo.",
    "channels": ["#project"],
    "communication": {"coordinatorAgent": "pm"},
    "scheduler": {"kind": "nonpreemptive-signals", "maxSignalsPerActivation": 20},
    "agents": {
        "pm": {"prompt": "You coordinate.", "tools": ["messages.send", "completion.submit"]},
        "worker": {"tools": ["*"]},
        "verifier": {"tools": ["messages.send"]},
    },
}


def make_config(**overrides):
    config = copy.deepcopy(BASE_CONFIG)
    for key, value in overrides.items():
        config[key] = value
    return config


def expanded_agents(config):
    """The agents `suzumio init` hands the store: the config's counted-agent expansion."""
    return suzumio_config.ProjectConfig.from_data(config).agents


def init_demo(root_path, config=None, start=True, now=T0):
    """Initialize `demo` under root_path and (by default) set it running."""
    config = config or make_config()
    root = st.Root(root_path)
    store = root.init_project(config["name"], config["task"], config, expanded_agents(config),
                              "name: demo\n", "name: demo\n", now=now)
    if start:
        store.start(now=now)
    return root, store


def at(seconds, base=T0):
    """A timestamp `seconds` after base."""
    return format_ts(parse_ts(base) + timedelta(seconds=seconds))


CONFIGS = suzumio_config.ConfigCache()


def config_of(store):
    """The store's typed ProjectConfig, as the runtime's one ConfigCache hands it to the rules."""
    return CONFIGS.get(store)


def rows(store, sql, params=()):
    return store.db_all(sql, params)


def count(store, table, where="1=1", params=()):
    return store.db_get(f"SELECT COUNT(*) AS n FROM {table} WHERE {where}", params)["n"]


def snapshot(store):
    """Every row of every table, to compare before/after a rejected operation."""
    tables = [r["name"] for r in rows(store, "SELECT name FROM sqlite_master WHERE type='table'")]
    return {t: rows(store, f"SELECT * FROM {t} ORDER BY rowid") for t in tables}


def event_types(store):
    return [e["type"] for e in reversed(store.list_events(1000))]
