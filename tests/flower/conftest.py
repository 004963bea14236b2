"""Fixtures of the Flower tests: Flower itself (skipped without it) and an in-process grid.

:class:`DirectGrid` is a :class:`flwr.serverapp.Grid` that hands each message
to a real ClientApp in this process and returns its reply, the way Flower's
simulation engine does without Ray: the server and client code under test are
the real ones, and a test can make a node fail (``dead``: no reply; an
exception: an error reply) or rewrite a reply (``tamper``).
"""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture(scope="session")
def flwr():
    return pytest.importorskip("flwr")


@pytest.fixture
def direct_grid(flwr):
    """The DirectGrid class; the process-wide task identity it sets is restored after the
    test (Flower's own runtimes, e.g. the simulation engine, rely on it)."""
    from flwr.app import Context, Error, Message, RecordDict
    from flwr.serverapp import Grid
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id)

    class DirectGrid(Grid):
        def __init__(self, client_app, node_users: dict[int, list[int]], *, dead=(),
                     tamper=None):
            # who sends: the runtime sets this for a ServerApp process; here, this process
            TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
            self.app = client_app
            self.node_users = node_users
            self.dead = set(dead)
            self.tamper = tamper
            self.replies: dict[str, Message] = {}
            self.contexts = {
                n: Context(run_id=1, node_id=n, node_config={"users": ",".join(map(str, us))},
                           state=RecordDict(), run_config={})
                for n, us in node_users.items()}

        def set_run(self, run):  # pragma: no cover - not used by the apps
            pass

        @property
        def run(self):  # pragma: no cover
            return None

        def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
            return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

        def get_node_ids(self):
            return list(self.node_users)

        def get_nodes(self):  # pragma: no cover
            return []

        def push_messages(self, messages):
            ids = []
            for msg in messages:
                msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
                ids.append(msg.metadata.message_id)
                node = msg.metadata.dst_node_id
                if node in self.dead:
                    continue
                try:
                    reply = self.app(msg, self.contexts[node])
                except Exception as exc:  # noqa: BLE001 - Flower turns it into an error reply
                    reply = Message(Error(code=1, reason=f"{type(exc).__name__}: {exc}"),
                                    reply_to=msg)
                if self.tamper is not None:
                    reply = self.tamper(msg, reply) or reply
                self.replies[msg.metadata.message_id] = reply
            return ids

        def pull_messages(self, message_ids):
            return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]

        def send_and_receive(self, messages, *, timeout=None):
            return self.pull_messages(self.push_messages(messages))

    yield DirectGrid
    TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id = saved
