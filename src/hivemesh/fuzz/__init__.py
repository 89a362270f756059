"""Fuzzing every decoder that faces the network or the user.

The targets (:mod:`hivemesh.fuzz.targets`): frames on a Peer's link (feed
batches, have/want, blobs, direct and relayed messages, membership, leases,
join frames), the msgpack codec and signed events, the three Noise handshake
messages, encrypted session records, telemetry batch envelopes, append-log
files imported into a journal, invite tokens, control-socket request lines,
``hivemesh call`` FIELD=VALUE words, the web-tools and mesh MCP servers'
tool inputs and relay channel messages. The engine
(:mod:`hivemesh.fuzz.engine`) counts inputs and outcomes per target: a
typed error (:class:`~hivemesh.errors.HivemeshError`) is the contract;
anything else is a finding.

CI feeds a fixed budget through hypothesis (``tests/test_fuzz_budget.py``);
a longer run, with no hypothesis needed, is one command away::

    hivemesh fuzz --budget 2000000 --seed 7 --json
"""

from hivemesh.fuzz.engine import Finding as Finding
from hivemesh.fuzz.engine import Tally as Tally
from hivemesh.fuzz.engine import feed_one as feed_one
from hivemesh.fuzz.engine import mutate as mutate
from hivemesh.fuzz.engine import run_budget as run_budget
from hivemesh.fuzz.targets import Target as Target
from hivemesh.fuzz.targets import Untyped as Untyped
from hivemesh.fuzz.targets import all_targets as all_targets
from hivemesh.fuzz.targets import target_names as target_names

__all__ = [
    "Finding",
    "Tally",
    "Target",
    "Untyped",
    "all_targets",
    "feed_one",
    "mutate",
    "run_budget",
    "target_names",
]
