"""One node, one machine: the sans-IO :class:`Peer`.

Theory of operation
-------------------
A :class:`Peer` owns everything a node decides: the journal node
(:class:`~hivemesh.core.node.Node`: feeds, replication, the own feed's gate),
SWIM membership, direct messages, blob fetching, claims, names, endpoints,
trust (``trust.json`` content plus the journal's web of vouches), invite
probation and joins, the lease voter and proposer, and settlement of
attested batches. A driver moves bytes, time and files and
decides nothing: the asyncio daemon (:mod:`hivemesh.runtime.daemon`), the
simulator, or a test with a list for a network. Like aioquic's
``QuicConnection``, it is a plain object:

**Construction.** ``Peer(identity, store, rng, now_ms=..., config=PeerConfig(...),
trust=TrustFile(...), marks=..., leases=LeaseSetup(...))``. ``store`` is the node's
:class:`~hivemesh.core.store.FeedStore`, ``rng`` a ``random.Random`` (seeded
from :mod:`secrets` by the daemon, from the seed by the simulator), ``marks``
the own feed's durable mark, ``leases`` the lease voter's durable state
and saved voter set. Each part draws its own random stream from ``rng``
(``rng.getrandbits(128)``, in this order: node, membership, direct
messages, blob fetcher, ping nonces, leases). Then
:meth:`Peer.rehydrate` with the stored events, then :meth:`Peer.start`
with the endpoints the node listens on (this runs the appends of the new
life: see below).

**Inputs** (each takes ``now``: the driver's clock in ms; the daemon's is
monotonic, anchored at wall-clock time, since HLC stamps are physical time):

* :meth:`receive` -- a frame from the link to ``peer``;
* :meth:`link_up` / :meth:`link_down` -- a link to ``peer`` (with its boot
  id) is up and both sides admit each other, or it is gone;
* :meth:`command` -- a typed command (a :class:`hivemesh.commands.Command`:
  the public table's, or a driver's of :mod:`hivemesh.commands.peer`);
  returns a request id that the :class:`~hivemesh.core.effects.Reply` carries;
* :meth:`settle` -- the group commit is due: verify attested runs, then ask
  for :class:`~hivemesh.core.effects.Fsync`;
* :meth:`trust_changed` -- ``trust.json`` changed (its parsed content);
* :meth:`handle_timer` -- time passed (call at :meth:`next_deadline`);
* :meth:`admit_channel` -- a handshake: may this address's link come up
  (members, or an unknown peer on probation)? :meth:`redeemed` -- the trust
  store's answer to a join proof (:class:`Redeem`); :meth:`join_refused`
  -- a peer refused our link (:mod:`hivemesh.core.joins`);
* :meth:`lease_synced` -- the lease voter's log is synced
  (:mod:`hivemesh.core.lease_swarm`);
* :meth:`inbox_room`, :meth:`persisted`, :meth:`handled` -- the driver's
  durable inbox and message handlers (see *Direct messages* below).

**Outputs.** :meth:`effects` drains the typed effects of
:mod:`hivemesh.core.effects` in order; :meth:`next_deadline` is the one time
to call :meth:`handle_timer` next.

**Rules it owns** (each was a runtime mixin's):

* *Membership* (SWIM, :mod:`hivemesh.core.membership`). ``up``: keep a link
  to the member (:class:`Dial`), replicate with it when its link is up, and
  append ``member.up`` when it comes back from ``down``. ``down``/``left``:
  stop replicating, append ``member.down``/``member.left`` with ``a`` (its
  key) and ``upto`` (the last seq of its feed we hold), so that claims and
  plans release exactly what this observation is causally after
  (:mod:`hivemesh.core.claims`); on ``down`` close its link if nothing
  arrived on it (no frame since it came up) for a whole suspicion period:
  a half-open link (``dropped_silent_link``). A link that comes up
  for an unknown address joins membership through it.
* *A new life.* Once the own feed takes writes (at :meth:`start`, or when
  it is recovered from peers): release the live claims of the previous life,
  announce the endpoint if it changed (``node.hello``), claim the configured
  name. Every change of the feed gate's state is logged.
* *Settlement.* Attested batches are verified at the group commit; a peer
  whose head signature fails is disconnected.
* *Trust.* ``authorize(address)``: ``open`` mode admits anyone not revoked;
  ``invite`` mode the addresses of ``trust.json`` and the swarms' web of
  vouches (:mod:`hivemesh.core.views.trust`); a pending join's inviter
  always. When trust changes (the file, or a vouch or revocation in the
  journal), linked peers no longer admitted are closed and forgotten, and
  newly admitted known ones are dialled.
* *Endpoints.* A ``node.hello`` from another node dials it.
* *Invites and joins* (:mod:`hivemesh.core.joins`): probation of unknown
  peers, the answer to a join proof, pending joins.
* *Leases* (:mod:`hivemesh.core.lease_swarm`): the quorum voter and
  proposer over ``LEASE`` frames; a reply waits for its voter-log sync.
* *Views.* context, names, endpoints, trust, claims, the blob index and
  max-registers (``reg.max``, for fencing tokens) are the Peer's; a driver
  may add application views to :attr:`node` before :meth:`rehydrate`.
* *Blobs.* Frames of the blob range are served from the store or fed to the
  fetcher; a completed fetch is stored and answers its commands.
* *Direct messages.* The protocol is :class:`~hivemesh.core.direct.Direct`;
  what happens to a received message (reply, request for a served kind,
  plain message, the durable inbox) is :mod:`hivemesh.core.mailbox`'s:
  :class:`Persist` and :class:`Handle` effects, answered by the inputs
  :meth:`persisted` and :meth:`handled`; :meth:`inbox_room` says how much
  the driver's durable inbox takes. ``SendDirect`` answers at its ack,
  ``Request`` at its reply, ``Ping`` at its pong; every outcome of a send is
  also a :class:`MessageOutcome` effect.
* *Majority barriers* (:mod:`hivemesh.core.barrier`): ``SyncMajority``
  asks the lease voters for their heads over direct requests and answers
  when a majority holds our feed (and, with ``pull``, once this node caught
  up with them); the Peer serves those requests (``journal.heads``) itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from random import Random
from typing import Any

from hivemesh.commands import coordination as coord
from hivemesh.commands import messages as msgs
from hivemesh.commands.names import NameClaim, NameClaimReply
from hivemesh.commands.node import Append, FeedAcceptLoss
from hivemesh.commands.peer import (
    AppendMany,
    FetchBlob,
    Learn,
    Leave,
    Request,
    Resolve,
    Serve,
    StartJoin,
    Vouch,
)
from hivemesh.commands.sync import SyncMajority
from hivemesh.commands.trust import TrustRevoke, TrustRevokeReply
from hivemesh.core.answers import ANSWERS
from hivemesh.core.barrier import HEADS_KIND, Majority
from hivemesh.core.claims import DEFAULT_WINDOW_MS, ClaimsView, check_resource
from hivemesh.core.direct import Direct, DirectAcked, DirectConfig
from hivemesh.core.effects import (
    Close,
    Count,
    Deliver,
    Dial,
    Effect,
    Fsync,
    Handle,
    Log,
    MessageOutcome,
    Reply,
    Send,
)
from hivemesh.core.event import Event
from hivemesh.core.frames import FrameType, encode_frame
from hivemesh.core.hlc import hlc_ms
from hivemesh.core.identity import Identity, address_of, public_key_of
from hivemesh.core.joins import Joins
from hivemesh.core.lease_quorum import Acquire, Op, Release, Renew, Show
from hivemesh.core.lease_swarm import KIND_VOTERS, LeaseSetup, SwarmLeases
from hivemesh.core.mailbox import Mailbox
from hivemesh.core.membership import Membership
from hivemesh.core.node import Node, NodeConfig
from hivemesh.core.ownfeed import FeedState, MarkStore
from hivemesh.core.pex import MembershipConfig, MemberState
from hivemesh.core.store import FeedStore
from hivemesh.core.trace import Trace
from hivemesh.core.views.blobs import BLOB_TAGS, TAG_GET, TAG_WANT, BlobFetcher, BlobIndex, serve
from hivemesh.core.views.context import ContextView
from hivemesh.core.views.endpoints import KIND_HELLO, EndpointsView, hello_body
from hivemesh.core.views.names import NamesView
from hivemesh.core.views.registers import MaxRegisterView
from hivemesh.core.views.trust import KIND_TRUST_ADD, KIND_TRUST_REVOKE, TrustView, TrustWeb
from hivemesh.errors import (
    DeadlineExceeded,
    DecodeError,
    HivemeshError,
    InvalidAddress,
    InvalidArgument,
    UnknownPeer,
)

__all__ = ["Peer", "PeerConfig", "TrustFile"]

#: Addresses cached from public keys (a cache, not a registry: cleared when full).
_MAX_ADDRESSES = 65_536
_TRUST_KINDS = frozenset({KIND_TRUST_ADD, KIND_TRUST_REVOKE})


@dataclass(frozen=True, slots=True)
class TrustFile:
    """What the Peer's trust decisions need from ``trust.json`` (parsed by the driver)."""

    #: addresses this node admitted itself
    trusted: frozenset[str] = frozenset()
    #: addresses this node revoked
    revoked: frozenset[str] = frozenset()
    #: the swarms this node belongs to (its home swarm first)
    swarms: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PeerConfig:
    """How one Peer behaves. Units are in the names."""

    node: NodeConfig = field(default_factory=NodeConfig)
    membership: MembershipConfig = field(default_factory=MembershipConfig)
    direct: DirectConfig = field(default_factory=DirectConfig)
    #: ``open``: anyone not revoked; ``invite``: trust.json and the web of trust
    trust_mode: str = "open"
    #: how far vouches are followed (:data:`~hivemesh.core.views.trust.VOUCH_POLICIES`)
    trust_vouches: str = "web"
    #: claims settle window (swarm-wide; must exceed the usual propagation delay)
    claim_settle_ms: int = DEFAULT_WINDOW_MS
    #: the name this node claims when it starts (None: none)
    name: str | None = None
    #: the lease quorum's voters (empty: fixed at first use,
    #: :mod:`hivemesh.core.lease_swarm`)
    lease_voters: tuple[str, ...] = ()


@dataclass(slots=True)
class _Wait:
    """A command answered later: at its input, or with an error at ``deadline_ms``."""

    rid: int
    deadline_ms: int
    what: str
    resource: str = ""
    digest: bytes = b""
    nonce: int = 0


class Peer:
    """One node's whole protocol (see module docs)."""

    def __init__(
        self,
        identity: Identity,
        store: FeedStore,
        rng: Random,
        *,
        now_ms: int,
        config: PeerConfig | None = None,
        trust: TrustFile | None = None,
        marks: MarkStore | None = None,
        leases: LeaseSetup | None = None,
        trace: Trace | None = None,
    ) -> None:
        """``leases``: the lease voter's durable state and saved voter set
        (:mod:`hivemesh.core.lease_swarm`); ``trace``: record every input and
        effect for a replay (:mod:`hivemesh.core.trace`; tests and debugging)."""
        self.config = cfg = config or PeerConfig()
        self._trace = trace
        lease_setup = leases or LeaseSetup()
        if trace is not None:
            saved = None if marks is None else (marks.load(),)
            trace.begin(now_ms, cfg, trust or TrustFile(), saved, lease_setup)
        self.identity = identity
        self.address = identity.address
        self.store = store
        self.counters: Counter[str] = Counter()
        self._fx: list[Effect] = []
        self._trust = trust or TrustFile()
        self._inviters: set[str] = set()
        self._web: tuple[tuple[TrustFile, int], TrustWeb] | None = None
        self._addresses: dict[bytes, str] = {}
        self._links: dict[str, bytes] = {}  # address -> the boot id of its life
        self._heard: dict[str, int] = {}  # address -> when a link to it last carried a frame
        self._advertised: tuple[str, ...] = ()
        self._new_life_pending = True
        self._now = now_ms  # the last input's time
        self._rid = 0
        self._waits: dict[int, _Wait] = {}
        self._sends: dict[str, int] = {}  # direct msg_id -> rid
        invite = cfg.trust_mode == "invite"
        self.node = Node(
            identity,
            store,
            Random(rng.getrandbits(128)),
            now_ms=now_ms,
            config=cfg.node,
            trusted=self.author_trusted,
            shares=self.shares if invite else None,
            marks=marks,
        )
        node = self.node
        self.context = ContextView(identity.public)
        self.context.before_write = node.feed_gate.check  # refused while recovering
        self.names = NamesView()
        self.endpoints = EndpointsView()
        self.trust_view = TrustView()
        self.claims = ClaimsView(window_ms=cfg.claim_settle_ms)
        self.blob_index = BlobIndex()
        self.registers = MaxRegisterView()
        for view in (
            self.context,
            self.names,
            self.endpoints,
            self.trust_view,
            self.claims,
            self.blob_index,
            self.registers,
        ):
            node.add_view(view)
        self.membership = Membership(
            self.address,
            (),
            Random(rng.getrandbits(128)),
            cfg.membership,
            now_ms,
            node.send,
            admit=self.authorize,
        )
        self.membership.attach(node)
        self.direct = Direct(
            node,
            Random(rng.getrandbits(128)),
            cfg.direct,
            relays=self._relays,
            admit=self.authorize,
        )
        self.fetcher = BlobFetcher(Random(rng.getrandbits(128)))
        for tag in BLOB_TAGS:
            node.register_handler(tag, self._blob_handler(tag))
        self.mailbox = Mailbox(self.direct, self.address)
        journal = node.journal
        self.majority = Majority(
            self.address,
            identity.public.hex(),
            held=lambda author: journal.head(bytes.fromhex(author)).seq,
            vv=lambda: {a.hex(): s for a, s in journal.version_vector().items()},
            trusted=lambda author: journal.trusted is None or journal.trusted(author),
        )
        self.mailbox.serve(HEADS_KIND, plain=False)
        self._rng = Random(rng.getrandbits(128))  # ping nonces
        node.register_handler(FrameType.RT_PING, self._on_ping)
        node.register_handler(FrameType.RT_PONG, self._on_pong)
        lease_rng = Random(rng.getrandbits(128))
        self.leases = SwarmLeases(
            self.address,
            lease_setup,
            cfg.lease_voters,
            now_ms,
            fx=self._fx,
            authorize=self.authorize,
            live=self._live_voters,
            members_up=self._members_up,
            publish=self._publish_voters,
            nonce=lambda: lease_rng.getrandbits(48),
        )
        node.add_view(self.leases.published)
        node.register_handler(FrameType.LEASE, self.leases.on_frame)
        self.joins = Joins(
            self._fx,
            authorize=self.authorize,
            revoked=lambda address: address in self._trust.revoked,
            count=self._count,
            log=self._log,
            send=node.send,
            vouch=self._vouch_into,
            swarm_members=self._swarm_members,
            trust_changed=self._trust_learnt,
            inviters=self._inviters,
            link=self._link_up,
        )
        node.register_handler(FrameType.RT_JOIN, self.joins.on_join)
        node.register_handler(FrameType.RT_JOINED, self.joins.on_joined)
        node.register_handler(FrameType.RT_JOIN_REFUSED, self.joins.on_join_refused)
        self._feed_state = node.feed_gate.state
        self._trust_version = self.trust_view.version

    # -- start -------------------------------------------------------------------

    def rehydrate(self, events: Iterable[Event], now_ms: int) -> int:
        """Replay stored (verified) events into the views; returns how many."""
        if self._trace is not None:
            events = list(events)
            self._trace.record("rehydrate", events, now_ms)
        n = self.node.rehydrate(events, now_ms)
        self._trust_version = self.trust_view.version
        return n

    def start(self, endpoints: Iterable[str], now_ms: int) -> None:
        """The node listens at ``endpoints``: membership announces them, and
        the appends of a new life run now if the own feed takes writes
        (their errors propagate: the node does not start)."""
        self._advertised = tuple(endpoints)
        if self._trace is not None:
            self._trace.record("start", self._advertised, now_ms)
        self.membership.endpoints = self._advertised
        if self.node.feed_gate.state is not FeedState.WRITABLE:
            self._log("warning", f"node {self.address[:12]} refuses writes: {self._reason()}")
        else:
            self._new_life(now_ms)
        self._after(now_ms)

    # -- inputs ------------------------------------------------------------------

    def receive(self, peer: str, frame: bytes, now_ms: int) -> None:
        """A frame from the link to ``peer``."""
        if self._trace is not None:
            self._trace.record("receive", peer, frame, now_ms)
        self._heard[peer] = now_ms
        if self.joins.held(peer):
            self.joins.probation_frame(peer, frame, now_ms)
        else:
            self.node.receive(peer, frame, now_ms)
        self._after(now_ms)

    def receive_many(self, peer: str, frames: Iterable[bytes], now_ms: int) -> bool:
        """Frames read from ``peer`` at once (the same as :meth:`receive` each).

        Returns whether :meth:`next_deadline` may have moved earlier: not
        when every frame was EVENTS (applying pushed events arms no timer,
        and a gap's pull is a send), so the driver need not look again."""
        if self._trace is not None:
            frames = list(frames)
            self._trace.record("receive_many", peer, frames, now_ms)
        self._heard[peer] = now_ms
        receive = self.node.receive
        moved = False
        for frame in frames:
            moved = moved or frame[2:3] != _EVENTS_TYPE_BYTE
            if self.joins.held(peer):
                self.joins.probation_frame(peer, frame, now_ms)
            else:
                receive(peer, frame, now_ms)
        self._after(now_ms)
        return moved

    def link_up(self, peer: str, boot_id: bytes, now_ms: int, endpoint: str | None = None) -> None:
        """A link to ``peer`` (of life ``boot_id``; ``endpoint``: where we
        reached it, if we dialled) is up and both sides admit each other:
        replicate with it, join membership through it if it is new, and
        resend direct messages waiting for it."""
        if self._trace is not None:
            self._trace.record("link_up", peer, boot_id, now_ms, endpoint)
        self._heard[peer] = now_ms
        if self.joins.link_up(peer, boot_id, now_ms, endpoint):
            self._link_up(peer, boot_id, now_ms, endpoint)
        self._after(now_ms)

    def _link_up(self, peer: str, boot_id: bytes, now_ms: int, endpoint: str | None) -> None:
        self._links[peer] = boot_id
        eps = self.endpoints.endpoints(peer)
        if not eps and endpoint is not None:
            eps = [endpoint]
        m = self.membership
        if m.member(peer) is None:
            m.join(peer, eps, now_ms)
        rec = m.member(peer)
        if rec is None or rec.state not in (MemberState.DOWN, MemberState.LEFT):
            self.node.add_peer(peer)
            self.node.sync_with(peer)
        self.direct.link_up(peer, now_ms)

    def link_down(self, peer: str, boot_id: bytes, now_ms: int) -> None:
        """The link to ``peer`` is gone: stop replicating, keep dialling it."""
        if self._trace is not None:
            self._trace.record("link_down", peer, boot_id, now_ms)
        self.joins.link_down(peer)
        if self._links.get(peer) == boot_id:
            del self._links[peer]
            self._heard.pop(peer, None)
        self.node.remove_peer(peer)
        self._dial(peer, self.endpoints.endpoints(peer))
        self._after(now_ms)

    def admit_channel(self, address: str, invites_open: bool, now_ms: int) -> bool:
        """The handshake with ``address``: may its link come up? Members as
        usual; an unknown, unrevoked address on probation while
        ``invites_open`` (this node remembers invites it issued; see
        :mod:`hivemesh.core.joins`)."""
        if self._trace is not None:
            self._trace.record("admit_channel", address, invites_open, now_ms)
        admitted = self.joins.admit_channel(address, invites_open, now_ms)
        self._after(now_ms)
        return admitted

    def redeemed(
        self,
        peer: str,
        swarm: str | None,
        new: bool,
        error: HivemeshError | None,
        now_ms: int,
    ) -> None:
        """The trust store answered :class:`Redeem` for ``peer``: admitted
        into ``swarm`` (``new``: its invite was unused), or ``error``."""
        if self._trace is not None:
            self._trace.record("redeemed", peer, swarm, new, error, now_ms)
        self.joins.redeemed(peer, swarm, new, error, now_ms)
        self._after(now_ms)

    def join_refused(self, peer: str, error: HivemeshError, exhausted: bool, now_ms: int) -> None:
        """``peer`` refused our link (its CLOSE code, or the handshake;
        ``exhausted``: every endpoint dialled for it proved another node)."""
        if self._trace is not None:
            self._trace.record("join_refused", peer, error, exhausted, now_ms)
        self.joins.refused(peer, error, exhausted, now_ms)
        self._after(now_ms)

    def trust_changed(self, trust: TrustFile, now_ms: int) -> None:
        """``trust.json`` changed: act on who is admitted now."""
        if self._trace is not None:
            self._trace.record("trust_changed", trust, now_ms)
        if trust != self._trust:
            self._trust = trust
            self._recheck_trust(now_ms)
        self._after(now_ms)

    def settle(self, now_ms: int) -> None:
        """The group commit is due: store attested runs whose signature
        holds (a peer that sent a bad one is closed), then :class:`Fsync`."""
        if self._trace is not None:
            self._trace.record("settle", now_ms)
        for peer in self.node.settle():
            self._log("warning", f"{peer[:12]} sent an invalid head signature: disconnecting")
            self._fx.append(Close(peer, "invalid head signature"))
        self._fx.append(Fsync())
        self._after(now_ms)

    def handle_timer(self, now_ms: int) -> None:
        """Time passed: retransmit, probe, expire, settle due waits."""
        if self._trace is not None:
            self._trace.record("handle_timer", now_ms)
        self.node.handle_timer(now_ms)
        self.membership.handle_timer(now_ms)
        self.direct.handle_timer(now_ms)
        self.fetcher.handle_timer(now_ms)
        self.leases.handle_timer(now_ms)
        self.joins.handle_timer(now_ms)
        self._mail(self.mailbox.expire(now_ms), now_ms)
        self._after(now_ms)

    def inbox_room(self, n: int, now_ms: int) -> None:
        """The durable inbox has room for ``n`` more messages (at start, and
        whenever the driver removed some)."""
        if self._trace is not None:
            self._trace.record("inbox_room", n, now_ms)
        self.mailbox.room = n
        self._after(now_ms)

    def persisted(self, batch: int, ok: bool, now_ms: int) -> None:
        """The driver stored :class:`Persist` ``batch`` (``ok``) or failed to."""
        if self._trace is not None:
            self._trace.record("persisted", batch, ok, now_ms)
        self.mailbox.persisted(batch, ok)
        self._after(now_ms)

    def handled(self, key: int, reply: Any, error: str | None, now_ms: int) -> None:
        """The driver's handler for :class:`Handle` ``key`` returned ``reply``
        (or failed with ``error``, a short text for the requester)."""
        if self._trace is not None:
            self._trace.record("handled", key, reply, error, now_ms)
        self.mailbox.handled(key, reply, error, now_ms)
        self._after(now_ms)

    def lease_synced(self, upto: int, error: str | None, now_ms: int) -> None:
        """The driver synced the lease voter's log up to write ``upto``
        (:class:`LeaseSync`), or a write or the sync failed with ``error``
        (the voter stops: :mod:`hivemesh.core.lease_swarm`)."""
        if self._trace is not None:
            self._trace.record("lease_synced", upto, error, now_ms)
        if error is not None:
            self._log("warning", f"lease voter log failed, voter stopped: {error}")
        self.leases.synced(upto, error, now_ms)
        self._after(now_ms)

    def command(self, cmd: Any, now_ms: int) -> int:
        """Run a typed command; returns the id its :class:`Reply` carries.

        An unknown command type, or one whose arguments are wrong, is
        answered with a typed error (never raised)."""
        if self._trace is not None:
            self._trace.record("command", cmd, now_ms)
        self._rid += 1
        rid = self._rid
        handler = _COMMANDS.get(type(cmd))
        try:
            if handler is not None:
                handler(self, rid, cmd, now_ms)
            elif (answer := ANSWERS.get(type(cmd))) is not None:
                self._fx.append(Reply(rid, answer(self, cmd, now_ms)))
            else:
                raise InvalidArgument(f"unknown command {type(cmd).__name__}")
        except HivemeshError as exc:
            self._fx.append(Reply(rid, error=exc))
        self._after(now_ms)
        return rid

    # -- outputs -----------------------------------------------------------------

    def effects(self) -> list[Effect]:
        """What to do, in order (drains).

        Output queued on :attr:`node` outside an input (an application
        view added by the driver) is collected here too, at the last
        input's time."""
        if self.node.has_output:
            self._after(self._now)
        out = self._fx[:]  # the list itself is shared with the parts that append to it
        self._fx.clear()
        if self._trace is not None:
            self._trace.drained(out)
        return out

    def next_deadline(self) -> int:
        """When to call :meth:`handle_timer` next (ms, the inputs' clock)."""
        d = min(self.node.next_deadline(), self.membership.next_deadline())
        for extra in (
            self.direct.next_deadline(),
            self.fetcher.next_deadline(),
            self.mailbox.next_deadline(),
            self.leases.next_deadline(),
            self.joins.next_deadline(),
            self.majority.next_deadline(),
        ):
            if extra is not None and extra < d:
                d = extra
        for w in self._waits.values():
            d = min(d, self._wait_due(w))
        return d

    # -- queries -----------------------------------------------------------------

    @staticmethod
    def answers(command: type) -> bool:
        """Whether ``command`` is in the Peer's command table."""
        return command in _COMMANDS or command in ANSWERS

    @property
    def links(self) -> dict[str, bytes]:
        """Linked peers -> their boot id (a copy)."""
        return dict(self._links)

    def authorize(self, address: str) -> bool:
        """May ``address`` connect (and be a member)? Revoked never may
        (module docs)."""
        if address in self._inviters or address == self.address:
            return True
        if address in self._trust.revoked:
            return False
        if self.config.trust_mode == "open" or address in self._trust.trusted:
            return True
        return address in self.web().admitted

    def web(self) -> TrustWeb:
        """Our swarms' web of trust now (:mod:`hivemesh.core.views.trust`)."""
        key = (self._trust, self.trust_view.version)
        if self._web is None or self._web[0] != key:
            t = self._trust
            web = self.trust_view.evaluate(
                t.trusted, t.revoked, self.address, t.swarms, self.config.trust_vouches
            )
            self._web = (key, web)
        return self._web[1]

    def resolve(self, target: str) -> str:
        """An address for ``target``: an address, or a name claimed as far as
        this node knows (UnknownPeer otherwise)."""
        if target.startswith("hm") and len(target) == 58:
            try:
                public_key_of(target)
                return target
            except InvalidAddress:
                pass
        owner = self.names.resolve(target)
        if owner is None:
            raise UnknownPeer(
                f"no node has claimed the name {target!r} (as far as this node knows yet)"
            )
        return owner

    def author_trusted(self, author: bytes) -> bool:
        """The journal gate: may events authored by ``author`` be stored?"""
        return self.authorize(self._address_of(author))

    def shares(self, peer: str, author: bytes) -> bool:
        """May ``peer`` see ``author``'s feed? Its own and ours, and those of
        the members of a swarm it shares with us (``invite`` mode)."""
        a = self._address_of(author)
        return a == peer or a == self.address or self.web().shares(peer, a)

    def member_state(self, address: str) -> MemberState | None:
        """SWIM's view of ``address`` (None if unknown)."""
        rec = self.membership.member(address)
        return None if rec is None else rec.state

    def members_snapshot(self) -> dict[str, dict[str, Any]]:
        """``address -> {state, incarnation, since_ms, endpoints}``."""
        return {
            m.address: {
                "state": m.state.value,
                "incarnation": m.incarnation,
                "since_ms": m.since_ms,
                "endpoints": list(m.endpoints),
            }
            for m in self.membership.members()
        }

    def _live_voters(self, voters: list[str]) -> list[str]:
        """Self, then the voters linked now that membership sees up."""
        live = [
            v for v in voters if v in self._links and self.member_state(v) in (MemberState.UP, None)
        ]
        return [self.address, *live]

    def _vouch_into(self, address: str, swarm: str, now_ms: int) -> None:
        self.node.append(KIND_TRUST_ADD, {"address": address, "swarm": swarm}, now_ms)

    def _swarm_members(self, swarm: str) -> frozenset[str] | None:
        members = self.web().swarms.get(swarm)
        return None if members is None else frozenset(members)

    def _trust_learnt(self, address: str, swarm: str | None) -> None:
        """This node trusted ``address``, or joined ``swarm`` through it: the
        driver writes it to ``trust.json`` (whose next content will agree)."""
        t = self._trust
        if swarm is None:
            self._trust = replace(t, trusted=t.trusted | {address})
        elif swarm not in t.swarms:
            self._trust = replace(t, swarms=(*t.swarms, swarm))

    def _publish_voters(self, voters: list[str], now_ms: int) -> None:
        self.node.append(KIND_VOTERS, {"v": voters}, now_ms)

    def _members_up(self) -> list[str]:
        return [
            m.address
            for m in self.membership.members()
            if m.state in (MemberState.UP, MemberState.SUSPECT)
        ]

    def detection_bound_ms(self) -> int:
        """Worst case from a crash until every live member marks it down."""
        live = sum(
            1 for m in self.membership.members() if m.state in (MemberState.UP, MemberState.SUSPECT)
        )
        return self.config.membership.detection_bound_ms(live + 1)

    # -- the rules ---------------------------------------------------------------

    def _after(self, now_ms: int) -> None:
        """After every input: act on what changed, then move the node's
        output and events into effects (until handling them queued nothing)."""
        self._now = now_ms
        node = self.node
        fx = self._fx
        while True:
            self._on_member_changes(now_ms)
            self._on_feed_state(now_ms)
            self._on_fetcher()
            self._on_direct_results()
            self._mail(self.mailbox.route(now_ms), now_ms)
            if self.majority.busy:
                self._majority(now_ms)
            for rid, outcome in self.leases.outcomes():
                fx.append(Reply(rid, outcome))
            if self.trust_view.version != self._trust_version:
                self._trust_version = self.trust_view.version
                self._recheck_trust(now_ms)
            out = node.outbox()
            events = node.events()
            if not out and not events:
                break
            allowed = self.joins.allowed if self.joins.awaiting else None
            for peer, frame in out:
                if allowed is None or allowed(peer, frame):
                    fx.append(Send(peer, frame))
            if events:
                me = self.identity.public
                for ev in events:
                    if ev.kind == KIND_HELLO and ev.author != me:
                        addr = self._address_of(ev.author)
                        self._dial(addr, self.endpoints.endpoints(addr))
                fx.append(Deliver(tuple(events)))
            if not node.has_output:
                break
        if self._waits:
            self._check_waits(now_ms)

    def _on_member_changes(self, now_ms: int) -> None:
        cfg = self.config.membership
        for ch in self.membership.changes():
            self._log(
                "info",
                f"member {ch.address[:12]} "
                f"{ch.previous.value if ch.previous else 'new'} -> {ch.state.value}"
                f" (incarnation {ch.incarnation})",
            )
            if ch.state is MemberState.UP:
                self._dial(ch.address, list(ch.endpoints))
                if ch.address in self._links:
                    self.node.add_peer(ch.address)
                if ch.previous is MemberState.DOWN:
                    self._record("member.up", ch.address, ch.incarnation, now_ms)
            elif ch.state in (MemberState.DOWN, MemberState.LEFT):
                self.node.remove_peer(ch.address)
                quiet = cfg.suspicion_mult * cfg.probe_interval_ms
                if (
                    ch.state is MemberState.DOWN
                    and ch.address in self._links
                    and now_ms - self._heard.get(ch.address, 0) >= quiet
                ):  # half-open: its host vanished without a FIN
                    self._count("dropped_silent_link")
                    self._fx.append(Close(ch.address, "half-open"))
                self._record(f"member.{ch.state.value}", ch.address, ch.incarnation, now_ms)
            self._count(f"member_{ch.state.value}")

    def _record(self, kind: str, address: str, incarnation: int, now_ms: int) -> None:
        """Append a membership observation (kept while the feed takes no writes)."""
        author = public_key_of(address)
        body = {
            "address": address,
            "incarnation": incarnation,
            "observed_ms": now_ms,
            "a": author,
            "upto": self.node.journal.head(author).seq,
        }
        self.node.append_later([(kind, body)], now_ms)

    def _on_feed_state(self, now_ms: int) -> None:
        """Log a change of the own feed's gate; run the new life's appends
        once it takes writes (a failure is logged and counted)."""
        gate = self.node.feed_gate
        state = gate.state
        if state is self._feed_state:
            return
        self._feed_state = state
        if state is not FeedState.WRITABLE:
            self._log("warning", f"node {self.address[:12]} refuses writes: {self._reason()}")
            return
        self._log("warning", f"node {self.address[:12]}: own feed recovered up to #{gate.held.seq}")
        self._count("own_feed_recovered")
        if self._new_life_pending and self._advertised:
            try:
                self._new_life(now_ms)
            except HivemeshError as exc:
                self._count("first_writes_failed")
                self._log("warning", f"appends of the node's new life failed: {exc}")

    def _reason(self) -> str:
        return str(self.node.feed_gate.reason())

    def _new_life(self, now_ms: int) -> None:
        """Release the previous life's claims, announce a changed endpoint,
        claim the configured name (module docs)."""
        self._new_life_pending = False
        stale = self.claims.own_live(self.identity.public)
        if stale:
            self.node.append_many(
                [("claim.release", {"r": r, "seq": seq}) for r, seq in stale], now_ms
            )
            self._count("claims_abandoned", len(stale))
        if self.endpoints.endpoints(self.address) != list(self._advertised):
            self.node.append(KIND_HELLO, hello_body(list(self._advertised)), now_ms)
        name = self.config.name
        if name and self.names.resolve(name) != self.address:
            self.node.append(*NamesView.claim(name), now_ms)

    def _recheck_trust(self, now_ms: int) -> None:
        """Trust changed: close links no longer admitted, dial new ones."""
        for peer in sorted(self._links):
            if not self.authorize(peer):
                self._count("disconnected_revoked")
                self._cut_off(peer, now_ms)
        for address, eps in self.endpoints.known().items():
            if address not in self._links:
                self._dial(address, eps)
        self.joins.trust_rechecked(now_ms)

    def _cut_off(self, peer: str, now_ms: int) -> None:
        self._fx.append(Close(peer, "revoked", code=UnknownPeer.code, forget=True))
        self._links.pop(peer, None)
        self.node.remove_peer(peer)
        self.membership.forget(peer, now_ms)

    def _dial(self, address: str, endpoints: list[str]) -> None:
        if address != self.address and endpoints and self.authorize(address):
            self._fx.append(Dial(address, tuple(endpoints)))

    def _relays(self, destination: str) -> list[str]:
        peers = set(self.node.peers)
        return [a for a in sorted(self._links) if a in peers and a != destination]

    def _address_of(self, author: bytes) -> str:
        address = self._addresses.get(author)
        if address is None:
            if len(self._addresses) >= _MAX_ADDRESSES:
                self._addresses.clear()
            address = self._addresses[author] = address_of(author)
        return address

    def _log(self, level: str, message: str) -> None:
        self._fx.append(Log(level, message))

    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] += n
        self._fx.append(Count(name, n))

    # -- blobs and direct messages -------------------------------------------------

    def _blob_handler(self, tag: int) -> Callable[[str, list[Any], int], None]:
        def handler(peer: str, fields: list[Any], now_ms: int) -> None:
            frame = [tag, *fields]
            if tag in (TAG_WANT, TAG_GET):
                reply = serve(frame, self.store.get_blob)
                if reply is not None:
                    self.node.send(peer, encode_frame(reply[0], *reply[1:]))
            else:
                self.fetcher.receive(peer, frame, now_ms)

        return handler

    def _on_fetcher(self) -> None:
        fetcher = self.fetcher
        for peer, frame in fetcher.outbox():
            encoded = encode_frame(frame[0], *frame[1:])
            for p in [peer] if peer is not None else self.node.peers:
                self.node.send(p, encoded)
        for digest, data in fetcher.completed():
            self.store.put_blob(digest, data)
            for w in self._take_waits("blob", digest=digest):
                self._fx.append(Reply(w.rid, data))
        for digest in fetcher.failed():
            self._count("blob_fetch_failed")
            for w in self._take_waits("blob", digest=digest):
                err = DeadlineExceeded(f"no holder served blob {digest.hex()[:12]}")
                self._fx.append(Reply(w.rid, error=err))

    def _on_direct_results(self) -> None:
        for res in self.direct.results():
            acked = isinstance(res, DirectAcked)
            reason = None if isinstance(res, DirectAcked) else res.reason
            self._fx.append(MessageOutcome(res.msg_id, res.to, acked, res.attempts, reason))
            rid = self._sends.pop(res.msg_id, None)
            if rid is None:
                if not acked:
                    got = self.mailbox.unacked(res.msg_id)
                    if not got:  # replies are the only untracked sends
                        self.mailbox.counters["reply_failed"] += 1
                    self._mail(got, self._now)
                continue
            if acked:
                value = {"msg_id": res.msg_id, "to": res.to, "acked": True}
                self._fx.append(Reply(rid, {**value, "attempts": res.attempts}))
            else:
                err = DeadlineExceeded(
                    f"message {res.msg_id} to {res.to[:12]} not acknowledged"
                    f" ({reason}, {res.attempts} attempts)"
                )
                self._fx.append(Reply(rid, error=err))

    def _mail(self, effects: list[Effect], now_ms: int) -> None:
        """The mailbox's effects; those of the majority barriers stay inside."""
        majority = self.majority
        for e in effects:
            if (
                type(e) is Reply
                and e.rid < 0
                and majority.replied(e.rid, e.value, e.error is not None, now_ms)
            ):
                continue
            if type(e) is Handle and e.kind == HEADS_KIND and not e.plain:
                majority.serve(e.key, e.data, now_ms)
                continue
            self._fx.append(e)

    def _majority(self, now_ms: int) -> None:
        """Carry out the majority barriers' outputs (their sends stay inside)."""
        m = self.majority
        m.tick(now_ms)
        asks, answers, replies = m.take()
        for ask, voter, body, timeout_ms in asks:
            try:
                self.mailbox.request(ask, voter, HEADS_KIND, body, timeout_ms, now_ms)
            except HivemeshError:  # no way to that voter now: asked again later
                m.replied(ask, None, True, now_ms)
        for key, value in answers:
            self.mailbox.handled(key, value, None, now_ms)
        self._fx += replies

    # -- commands answered later ----------------------------------------------------

    def _take_waits(self, what: str, *, digest: bytes = b"") -> list[_Wait]:
        done = [w for w in self._waits.values() if w.what == what and w.digest == digest]
        for w in done:
            del self._waits[w.rid]
        return done

    def _wait_due(self, w: _Wait) -> int:
        if w.what != "claim":
            return w.deadline_ms
        winner = self.claims.winner(w.resource)
        if winner is None:
            return w.deadline_ms
        settles = hlc_ms(self.claims.order_hlc(winner)) + self.config.claim_settle_ms
        return min(w.deadline_ms, settles)

    def _check_waits(self, now_ms: int) -> None:
        for rid in sorted(self._waits):
            w = self._waits[rid]
            if w.what == "claim":
                got = self.claims.decided(w.resource, now_ms, self.config.claim_settle_ms)
                if got is not None:
                    del self._waits[rid]
                    winner = self._address_of(got)
                    ours = winner == self.address
                    reply = coord.ClaimWaitReply(resource=w.resource, winner=winner, ours=ours)
                    self._fx.append(Reply(rid, reply))
                    continue
            elif w.what == "name" and (owner := self.names.resolve(w.resource)) is not None:
                del self._waits[rid]
                self._fx.append(Reply(rid, owner))
                continue
            if w.deadline_ms <= now_ms:
                del self._waits[rid]
                if w.what == "blob":
                    if not any(o.digest == w.digest for o in self._waits.values()):
                        self.fetcher.cancel(w.digest)
                    err = DeadlineExceeded(f"blob {w.digest.hex()[:12]} not fetched in time")
                elif w.what == "ping":
                    err = DeadlineExceeded("no pong in time")
                elif w.what == "name":
                    err = DeadlineExceeded(f"no node claimed the name {w.resource!r} in time")
                else:
                    err = DeadlineExceeded(f"claim on {w.resource!r} not decided in time")
                self._fx.append(Reply(rid, error=err))

    # -- command handlers (the table is _COMMANDS below) ----------------------------

    def _do_append(self, rid: int, cmd: Append, now_ms: int) -> None:
        self._fx.append(Reply(rid, self.node.append(cmd.kind, cmd.body, now_ms)))

    def _do_append_many(self, rid: int, cmd: AppendMany, now_ms: int) -> None:
        self._fx.append(Reply(rid, self.node.append_many(list(cmd.items), now_ms)))

    def _do_name_claim(self, rid: int, cmd: NameClaim, now_ms: int) -> None:
        self.node.append(*NamesView.claim(cmd.name), now_ms)
        owner = self.names.resolve(cmd.name) or self.address
        reply = NameClaimReply(name=cmd.name, owner=owner, ours=owner == self.address)
        self._fx.append(Reply(rid, reply))

    def _do_claim(self, rid: int, cmd: coord.Claim, now_ms: int) -> None:
        r = check_resource(cmd.resource)
        seq = next((s for res, s in self.claims.own_live(self.identity.public) if res == r), None)
        if seq is None:
            seq = self.node.append("claim.intent", {"r": r}, now_ms).seq
        w = self.claims.winner(r)
        winner = None if w is None else self._address_of(w.author)
        self._fx.append(Reply(rid, coord.ClaimReply(resource=r, seq=seq, winner=winner)))

    def _do_claim_release(self, rid: int, cmd: coord.ClaimRelease, now_ms: int) -> None:
        r = check_resource(cmd.resource)
        own = [(res, seq) for res, seq in self.claims.own_live(self.identity.public) if res == r]
        if own:
            self.node.append_many([("claim.release", {"r": r, "seq": s}) for _, s in own], now_ms)
        self._fx.append(Reply(rid, coord.ClaimReleaseReply(released=len(own))))

    def _do_claim_done(self, rid: int, cmd: coord.ClaimDone, now_ms: int) -> None:
        r = check_resource(cmd.resource)
        self.node.append("claim.done", {"r": r}, now_ms)
        self._fx.append(Reply(rid, coord.ClaimDoneReply(done=True)))

    def _do_claim_wait(self, rid: int, cmd: coord.ClaimWait, now_ms: int) -> None:
        r = check_resource(cmd.resource)
        self._waits[rid] = _Wait(rid, now_ms + _ms(cmd.timeout_s, 0), "claim", resource=r)

    def _do_fetch_blob(self, rid: int, cmd: FetchBlob, now_ms: int) -> None:
        local = self.store.get_blob(cmd.digest)
        if local is not None:
            self._fx.append(Reply(rid, local))
            return
        if not self.fetcher.want(cmd.digest, now_ms, self.blob_index.holders(cmd.digest)):
            raise DeadlineExceeded("too many blob fetches in flight; retry later")
        due = now_ms + _ms(cmd.timeout_s, 1)
        self._waits[rid] = _Wait(rid, due, "blob", digest=cmd.digest)

    def _do_resolve(self, rid: int, cmd: Resolve, now_ms: int) -> None:
        try:
            self._fx.append(Reply(rid, self.resolve(cmd.target)))
        except UnknownPeer:
            if cmd.timeout_s <= 0:
                raise
            due = now_ms + _ms(cmd.timeout_s, 1)
            self._waits[rid] = _Wait(rid, due, "name", resource=cmd.target)

    def _do_send(self, rid: int, cmd: msgs.Send, now_ms: int) -> None:
        msg_id = self.direct.send(cmd.to, cmd.data, now_ms, deadline_ms=_ms(cmd.timeout_s, 0))
        self._sends[msg_id] = rid

    def _do_revoke(self, rid: int, cmd: TrustRevoke, now_ms: int) -> None:
        public_key_of(cmd.address)
        self.node.append(KIND_TRUST_REVOKE, {"address": cmd.address}, now_ms)
        if cmd.address in self._links or cmd.address in self.node.peers:
            self._count("disconnected_revoked")
        self._cut_off(cmd.address, now_ms)
        self._fx.append(Reply(rid, TrustRevokeReply(revoked=cmd.address)))

    def _do_vouch(self, rid: int, cmd: Vouch, now_ms: int) -> None:
        public_key_of(cmd.address)
        self.node.append(KIND_TRUST_ADD, {"address": cmd.address, "swarm": cmd.swarm}, now_ms)
        self._fx.append(Reply(rid, True))

    def _do_learn(self, rid: int, cmd: Learn, now_ms: int) -> None:
        self._dial(cmd.address, list(cmd.endpoints))
        self._fx.append(Reply(rid, None))

    def _do_accept_feed_loss(self, rid: int, cmd: FeedAcceptLoss, now_ms: int) -> None:
        reason = self._reason()
        lost = self.node.accept_feed_loss(now_ms)
        self._log(
            "warning",
            f"node {self.address[:12]}: OPERATOR ACCEPTED THE LOSS of own feed"
            f" #{lost['lost_from']}..#{lost['lost_upto']} and writes on from"
            f" #{lost['held'] + 1} (was: {reason}); a peer that still holds those"
            " events will see a fork",
        )
        self._fx.append(Reply(rid, lost))

    def _do_request(self, rid: int, cmd: Request, now_ms: int) -> None:
        self.mailbox.request(rid, cmd.to, cmd.kind, cmd.body, _ms(cmd.timeout_s, 1), now_ms)

    def _do_serve(self, rid: int, cmd: Serve, now_ms: int) -> None:
        self.mailbox.serve(cmd.kind, plain=cmd.plain)
        self._fx.append(Reply(rid, True))

    def _do_ping(self, rid: int, cmd: msgs.Ping, now_ms: int) -> None:
        if cmd.address not in self._links:
            st = self.member_state(cmd.address)
            state = "unknown" if st is None else st.value
            raise UnknownPeer(f"no link to {cmd.address[:12]} (state: {state})")
        nonce = self._rng.getrandbits(62)
        self.node.send(cmd.address, encode_frame(FrameType.RT_PING, nonce))
        self._waits[rid] = _Wait(rid, now_ms + _ms(cmd.timeout_s, 1), "ping", nonce=nonce)

    def _on_ping(self, peer: str, fields: list[Any], now_ms: int) -> None:
        if len(fields) != 1 or type(fields[0]) is not int:
            raise DecodeError("RT_PING takes one int nonce")
        self.node.send(peer, encode_frame(FrameType.RT_PONG, fields[0]))

    def _on_pong(self, peer: str, fields: list[Any], now_ms: int) -> None:
        if len(fields) != 1 or type(fields[0]) is not int:
            raise DecodeError("RT_PONG takes one int nonce")
        for rid in sorted(self._waits):
            w = self._waits[rid]
            if w.what == "ping" and w.nonce == fields[0]:
                del self._waits[rid]
                self._fx.append(Reply(rid, None))
                return
        self.mailbox.counters["stale_pong"] += 1

    def _do_start_join(self, rid: int, cmd: StartJoin, now_ms: int) -> None:
        if cmd.inviter == self.address:
            raise InvalidArgument("this node issued the invite: run join on the new node")
        public_key_of(cmd.inviter)
        linked = cmd.inviter in self._links
        timeout = _ms(cmd.timeout_s, 1)
        self.joins.start(rid, cmd.inviter, cmd.endpoints, cmd.proof, timeout, linked, now_ms)

    def _do_leave(self, rid: int, cmd: Leave, now_ms: int) -> None:
        self.membership.leave(now_ms)
        self._fx.append(Reply(rid, True))

    def _lease(self, rid: int, op: Op, timeout_s: float, now_ms: int) -> None:
        """Run a lease operation; its :class:`Reply` carries the
        :class:`~hivemesh.core.lease_quorum.Outcome`."""
        self.leases.start(rid, op, _ms(timeout_s, 1), now_ms)

    def _do_lease_acquire(self, rid: int, cmd: coord.LeaseAcquire, now_ms: int) -> None:
        self._lease(rid, Acquire(cmd.resource, cmd.holder, cmd.ttl_ms), cmd.timeout_s, now_ms)

    def _do_lease_renew(self, rid: int, cmd: coord.LeaseRenew, now_ms: int) -> None:
        op = Renew(cmd.resource, cmd.holder, cmd.token, cmd.ttl_ms)
        self._lease(rid, op, cmd.timeout_s, now_ms)

    def _do_lease_release(self, rid: int, cmd: coord.LeaseRelease, now_ms: int) -> None:
        op = Release(cmd.resource, cmd.holder, cmd.token)
        self._lease(rid, op, cmd.timeout_s, now_ms)

    def _do_lease_show(self, rid: int, cmd: coord.LeaseShow, now_ms: int) -> None:
        self._lease(rid, Show(cmd.resource), cmd.timeout_s, now_ms)

    def _do_sync_majority(self, rid: int, cmd: SyncMajority, now_ms: int) -> None:
        voters = self.leases.voters(now_ms)
        self.majority.start(rid, voters, cmd.own_seq, cmd.pull, cmd.timeout_s, now_ms)

    def _do_lease_voters(self, rid: int, cmd: coord.LeaseVoters, now_ms: int) -> None:
        voters = self.leases.voters(now_ms)
        stats = self.leases.statistics()
        self._fx.append(Reply(rid, {**stats, "voters": voters, "majority": len(voters) // 2 + 1}))


#: Byte 2 of an encoded EVENTS frame (msgpack ``[version, type, ...]``).
_EVENTS_TYPE_BYTE = bytes([FrameType.EVENTS])


def _ms(timeout_s: float, least: int) -> int:
    """A command's ``timeout_s`` in whole milliseconds, at least ``least``."""
    return max(least, int(timeout_s * 1000))


#: command type -> its handler (the Peer's one command table)
_COMMANDS: dict[type, Callable[[Peer, int, Any, int], None]] = {
    Append: Peer._do_append,
    AppendMany: Peer._do_append_many,
    NameClaim: Peer._do_name_claim,
    coord.Claim: Peer._do_claim,
    coord.ClaimRelease: Peer._do_claim_release,
    coord.ClaimDone: Peer._do_claim_done,
    coord.ClaimWait: Peer._do_claim_wait,
    FetchBlob: Peer._do_fetch_blob,
    msgs.Send: Peer._do_send,
    TrustRevoke: Peer._do_revoke,
    Vouch: Peer._do_vouch,
    Learn: Peer._do_learn,
    Leave: Peer._do_leave,
    StartJoin: Peer._do_start_join,
    FeedAcceptLoss: Peer._do_accept_feed_loss,
    Request: Peer._do_request,
    Resolve: Peer._do_resolve,
    Serve: Peer._do_serve,
    msgs.Ping: Peer._do_ping,
    coord.LeaseAcquire: Peer._do_lease_acquire,
    coord.LeaseRenew: Peer._do_lease_renew,
    coord.LeaseRelease: Peer._do_lease_release,
    coord.LeaseShow: Peer._do_lease_show,
    coord.LeaseVoters: Peer._do_lease_voters,
    SyncMajority: Peer._do_sync_majority,
}
